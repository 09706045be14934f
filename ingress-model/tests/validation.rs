//! Validation by the API server's rules: each case is a manifest and the exact error lines.

use meshkit_ingress_model::manifest;
use meshkit_ingress_model::validation::{FieldError, validate_ingress, validate_ingress_class};

fn ingress_errors(spec_yaml: &str) -> Vec<String> {
    let yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: web, namespace: shop}}\nspec:\n{spec_yaml}"
    );
    let ingress = manifest::from_yaml_str(&yaml).expect("load").remove(0);
    match validate_ingress(&ingress) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.errors().iter().map(ToString::to_string).collect(),
    }
}

fn path_rule(host: &str, path: &str, path_type: &str, backend: &str) -> String {
    format!(
        "  rules:\n  - host: {host:?}\n    http:\n      paths:\n      - path: {path:?}\n{path_type}        backend: {backend}\n"
    )
}

const SVC: &str = "{service: {name: web, port: {number: 80}}}";

#[test]
fn valid_ingresses_pass() {
    assert!(
        ingress_errors(&path_rule(
            "shop.example.com",
            "/",
            "        pathType: Prefix\n",
            SVC
        ))
        .is_empty()
    );
    assert!(
        ingress_errors(&path_rule(
            "*.example.com",
            "/a/b",
            "        pathType: Exact\n",
            SVC
        ))
        .is_empty()
    );
    assert!(
        ingress_errors(&path_rule(
            "a.com",
            "",
            "        pathType: ImplementationSpecific\n",
            SVC
        ))
        .is_empty()
    );
    assert!(
        ingress_errors("  defaultBackend: {service: {name: web, port: {name: http}}}\n").is_empty()
    );
    assert!(
        ingress_errors(
            "  defaultBackend: {resource: {apiGroup: k8s.example.com, kind: Bucket, name: b}}\n"
        )
        .is_empty()
    );
}

#[test]
fn ingress_rules() {
    let cases: &[(String, &[&str])] = &[
        (
            "  tls: []\n".to_owned(),
            &[r#"spec: Invalid value: "": either `defaultBackend` or `rules` must be specified"#],
        ),
        (
            path_rule("a.com", "api", "        pathType: Prefix\n", SVC),
            &[
                r#"spec.rules[0].http.paths[0].path: Invalid value: "api": must be an absolute path"#,
            ],
        ),
        (
            path_rule("a.com", "/a//b", "        pathType: Exact\n", SVC),
            &[r#"spec.rules[0].http.paths[0].path: Invalid value: "/a//b": must not contain '//'"#],
        ),
        (
            path_rule("a.com", "/a/..", "        pathType: Prefix\n", SVC),
            &[r#"spec.rules[0].http.paths[0].path: Invalid value: "/a/..": cannot end with '/..'"#],
        ),
        (
            path_rule(
                "a.com",
                "x",
                "        pathType: ImplementationSpecific\n",
                SVC,
            ),
            &[r#"spec.rules[0].http.paths[0].path: Invalid value: "x": must be an absolute path"#],
        ),
        (
            path_rule("a.com", "/", "", SVC),
            &["spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"],
        ),
        (
            path_rule("a.com", "/", "        pathType: Regex\n", SVC),
            &[
                r#"spec.rules[0].http.paths[0].pathType: Unsupported value: "Regex": supported values: "Exact", "ImplementationSpecific", "Prefix""#,
            ],
        ),
        (
            path_rule("10.0.0.1", "/", "        pathType: Prefix\n", SVC),
            &[
                r#"spec.rules[0].host: Invalid value: "10.0.0.1": must be a DNS name, not an IP address"#,
            ],
        ),
        (
            path_rule("a.com:80", "/", "        pathType: Prefix\n", SVC),
            &[
                r#"spec.rules[0].host: Invalid value: "a.com:80": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"#,
            ],
        ),
        (
            path_rule("*", "/", "        pathType: Prefix\n", SVC),
            &[
                r#"spec.rules[0].host: Invalid value: "*": a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character"#,
            ],
        ),
        (
            path_rule(
                "a.com",
                "/",
                "        pathType: Prefix\n",
                "{service: {name: web, port: {number: 80}}, resource: {kind: B, name: b}}",
            ),
            &[
                r#"spec.rules[0].http.paths[0].backend: Invalid value: "": cannot set both resource and service backends"#,
            ],
        ),
        (
            path_rule(
                "a.com",
                "/",
                "        pathType: Prefix\n",
                "{service: {name: web, port: {name: http, number: 80}}}",
            ),
            &[
                r#"spec.rules[0].http.paths[0].backend.service.port: Invalid value: "": cannot set both port name & port number"#,
            ],
        ),
        (
            path_rule(
                "a.com",
                "/",
                "        pathType: Prefix\n",
                "{service: {name: web, port: {number: 70000}}}",
            ),
            &[
                r#"spec.rules[0].http.paths[0].backend.service.port.number: Invalid value: "70000": must be between 1 and 65535, inclusive"#,
            ],
        ),
        (
            path_rule(
                "a.com",
                "/",
                "        pathType: Prefix\n",
                "{service: {name: web}}",
            ),
            &[
                "spec.rules[0].http.paths[0].backend.service.port: Required value: port name or number is required",
            ],
        ),
        (
            path_rule(
                "a.com",
                "/",
                "        pathType: Prefix\n",
                "{service: {port: {number: 80}}}",
            ),
            &["spec.rules[0].http.paths[0].backend.service.name: Required value"],
        ),
        (
            "  defaultBackend: {}\n".to_owned(),
            &[r#"spec.defaultBackend: Invalid value: "": resource or service must be specified"#],
        ),
        (
            "  defaultBackend: {resource: {kind: Bucket}}\n".to_owned(),
            &["spec.defaultBackend.resource.name: Required value"],
        ),
        (
            format!(
                "  defaultBackend: {SVC}\n  tls:\n  - hosts: ['*.ok.com', 'Bad.com']\n    secretName: s_1\n"
            ),
            &[
                r#"spec.tls[0].hosts[1]: Invalid value: "Bad.com": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"#,
                r#"spec.tls[0].secretName: Invalid value: "s_1": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"#,
            ],
        ),
        (
            "  rules:\n  - host: a.com\n    http:\n      paths: []\n".to_owned(),
            &["spec.rules[0].http.paths: Required value"],
        ),
    ];
    for (spec, expected) in cases {
        let got = ingress_errors(spec);
        assert_eq!(got, *expected, "spec:\n{spec}");
    }
}

#[test]
fn metadata_name_is_required() {
    let ingress = manifest::from_yaml_str(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nspec: {defaultBackend: {service: {name: a, port: {number: 1}}}}\n",
    )
    .expect("load")
    .remove(0);
    let errors = validate_ingress(&ingress).expect_err("no name");
    assert_eq!(errors.errors()[0].path(), "metadata.name");
    assert!(matches!(errors.errors()[0], FieldError::Required { .. }));
}

fn class_errors(spec_yaml: &str) -> Vec<String> {
    let yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {{name: mesh}}\nspec:\n{spec_yaml}"
    );
    let class = manifest::ingress_classes_from_yaml_str(&yaml)
        .expect("load")
        .remove(0);
    match validate_ingress_class(&class) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.errors().iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn ingress_class_rules() {
    assert!(class_errors("  controller: meshkit.dev/ingress\n").is_empty());
    assert!(
        class_errors(
            "  controller: meshkit.dev/ingress\n  parameters: {apiGroup: k8s.example.com, kind: Params, name: p, scope: Namespace, namespace: infra}\n"
        )
        .is_empty()
    );
    assert_eq!(class_errors("  {}\n"), ["spec.controller: Required value"]);
    assert_eq!(
        class_errors(&format!("  controller: example.com/{}\n", "a".repeat(250))),
        ["spec.controller: Too long: may not be more than 250 bytes"]
    );
    assert_eq!(
        class_errors("  controller: ingress\n"),
        [
            r#"spec.controller: Invalid value: "ingress": must be a domain-prefixed path (such as "acme.io/foo")"#
        ]
    );
    assert_eq!(
        class_errors("  controller: a.io/x\n  parameters: {kind: P, name: p, scope: Namespace}\n"),
        ["spec.parameters.namespace: Required value: `parameters.scope` is set to 'Namespace'"]
    );
    assert_eq!(
        class_errors(
            "  controller: a.io/x\n  parameters: {kind: P, name: p, scope: Cluster, namespace: x}\n"
        ),
        ["spec.parameters.namespace: Forbidden: `parameters.scope` is set to 'Cluster'"]
    );
    assert_eq!(
        class_errors("  controller: a.io/x\n  parameters: {name: p, scope: Global}\n"),
        [
            "spec.parameters.kind: Required value",
            r#"spec.parameters.scope: Unsupported value: "Global": supported values: "Cluster", "Namespace""#,
        ]
    );
}

#[test]
fn labels_and_annotations() {
    let yaml = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: web\n  labels: {'app.kubernetes.io/name': 'bad value!'}\n  annotations: {'nginx.ingress.kubernetes.io/rewrite-target': /, 'bad key': x}\nspec: {defaultBackend: {service: {name: a, port: {number: 1}}}}\n";
    let ingress = manifest::from_yaml_str(yaml).expect("load").remove(0);
    let errors: Vec<String> = validate_ingress(&ingress)
        .expect_err("invalid")
        .errors()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errors,
        [
            r#"metadata.labels: Invalid value: "bad value!": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"#,
            r#"metadata.annotations: Invalid value: "bad key": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"#,
        ]
    );
}
