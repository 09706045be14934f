//! Manifest loading: `kubectl get ingress -o yaml` output, hand-written manifests, and the
//! round trip YAML -> types -> protobuf -> types -> YAML keeping every field.

mod support;

use meshkit_ingress_model::envelope;
use meshkit_ingress_model::manifest::{self, ManifestError};
use meshkit_ingress_model::{Ingress, IngressList, RouteTable};
use serde_json::Value;

const KUBECTL_OUTPUT: &str = include_str!("fixtures/kubectl-get-ingress.yaml");

fn yaml_values(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text).expect("valid YAML")
}

#[test]
fn loads_kubectl_list_output() {
    let ingresses = manifest::from_yaml_str(KUBECTL_OUTPUT).expect("load");
    assert_eq!(ingresses.len(), 2);
    let shop = &ingresses[0];
    let meta = shop.metadata.as_ref().expect("metadata");
    assert_eq!(meta.name.as_deref(), Some("shop"));
    assert_eq!(
        meta.creation_timestamp.as_ref().and_then(|t| t.seconds),
        Some(1_709_288_430)
    );
    assert_eq!(meta.managed_fields.len(), 2);
    let spec = shop.spec.as_ref().expect("spec");
    assert_eq!(spec.ingress_class_name.as_deref(), Some("nginx"));
    assert_eq!(spec.rules.len(), 2);

    let table = RouteTable::new(&ingresses);
    let m = table.route("shop.example.com", "/api").expect("route");
    assert_eq!(m.service_name(), Some("shop-api"));
    let m = table.route("eu.shop.example.com:443", "/x").expect("route");
    assert_eq!(m.service_name(), Some("tenant"));
    let m = table
        .route("unknown.example.org", "/")
        .expect("default backend");
    assert_eq!(
        m.backend()
            .resource
            .as_ref()
            .and_then(|r| r.kind.as_deref()),
        Some("StorageBucket")
    );
    assert_eq!(
        table
            .tls_secret_for("eu.shop.example.com")
            .map(|s| s.secret_name),
        Some("shop-tls")
    );
}

#[test]
fn round_trip_yaml_protobuf_yaml_keeps_every_field() {
    let ingresses = manifest::from_yaml_str(KUBECTL_OUTPUT).expect("load");

    // Through the Kubernetes protobuf envelope, one by one and as a list.
    let mut decoded = Vec::new();
    for ingress in &ingresses {
        let bytes = envelope::encode(ingress);
        decoded.push(envelope::decode::<Ingress>(&bytes).expect("decode"));
    }
    assert_eq!(decoded, ingresses);
    let list = IngressList {
        metadata: None,
        items: ingresses.clone(),
    };
    let list_back: IngressList = envelope::decode(&envelope::encode(&list)).expect("list");
    assert_eq!(list_back.items, ingresses);

    // Back to YAML: the same JSON values as the input items, field for field.
    let written = manifest::to_yaml_string(&decoded).expect("write");
    let written_values = yaml_values(&written);
    let input = yaml_values(KUBECTL_OUTPUT);
    let items = input[0]["items"].as_array().expect("items").clone();
    assert_eq!(written_values, items, "written YAML:\n{written}");

    // And loading what was written gives the same objects.
    assert_eq!(
        manifest::from_yaml_str(&written).expect("reload"),
        ingresses
    );

    // JSON too.
    for ingress in &ingresses {
        let json = manifest::to_json_string(ingress).expect("json");
        assert_eq!(
            manifest::from_json_str(&json).expect("json load"),
            vec![ingress.clone()]
        );
    }
}

#[test]
fn hand_written_multi_document_yaml() {
    let yaml = r#"
# A Service, skipped.
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  ports:
  - port: 80
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: a
spec:
  rules:
  - http:
      paths:
      - path: /a
        pathType: Prefix
        backend:
          service:
            name: a
            port:
              number: 80
---
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: mesh
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: meshkit.dev/ingress
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: b
spec:
  defaultBackend:
    service:
      name: b
      port:
        name: http
"#;
    let ingresses = manifest::from_yaml_str(yaml).expect("load");
    let names: Vec<_> = ingresses
        .iter()
        .filter_map(|i| i.metadata.as_ref()?.name.clone())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let classes = manifest::ingress_classes_from_yaml_str(yaml).expect("classes");
    assert_eq!(classes.len(), 1);
    let table = RouteTable::builder()
        .ingress_class("mesh")
        .ingress_classes(&classes)
        .build(&ingresses);
    assert_eq!(
        table.route("x", "/a/b").and_then(|m| m.service_name()),
        Some("a")
    );
    assert_eq!(
        table.route("x", "/zzz").and_then(|m| m.service_name()),
        Some("b")
    );
}

#[test]
fn errors_name_document_and_path() {
    let yaml = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: ok}\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: bad\n  creationTimestamp: last tuesday\n";
    match manifest::from_yaml_str(yaml) {
        Err(ManifestError::Field { document, path, .. }) => {
            assert_eq!(document, 1);
            assert_eq!(path, "metadata.creationTimestamp");
        }
        other => panic!("unexpected {other:?}"),
    }
    let yaml =
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nspec:\n  tls:\n  - hosts: [a, {b: c}]\n";
    let err = manifest::from_yaml_str(yaml).expect_err("bad host");
    assert!(
        err.to_string()
            .starts_with("document 0: spec.tls[0].hosts[1]:"),
        "{err}"
    );
    assert!(matches!(
        manifest::from_yaml_str("a: [b"),
        Err(ManifestError::Yaml(_))
    ));
    assert!(matches!(
        manifest::from_json_str("{"),
        Err(ManifestError::Json(_))
    ));
}

#[test]
fn yaml_output_quotes_strings_that_look_like_other_types() {
    let tricky = [
        "",
        "null",
        "~",
        "true",
        "yes",
        "on",
        "NO",
        "1",
        "1.5",
        "1e3",
        "0x10",
        "0o7",
        ".inf",
        "-",
        "- a",
        ": x",
        "#c",
        "a: b",
        "'q'",
        "\"dq\"",
        "multi\nline",
        " lead",
        "trail ",
        "@x",
        "`x",
        "%x",
        "&a",
        "*a",
        "!t",
        "{x}",
        "[x]",
        "2024-01-01",
        "=",
        "<<",
    ];
    let mut ingress = Ingress::default();
    let meta = ingress.metadata.get_or_insert_with(Default::default);
    for (i, value) in tricky.iter().enumerate() {
        meta.annotations
            .insert(format!("k{i}"), (*value).to_owned());
    }
    meta.name = Some("null".to_owned());
    let written = manifest::to_yaml_string(std::slice::from_ref(&ingress)).expect("write");
    let back = manifest::from_yaml_str(&written).expect("reload");
    assert_eq!(back, vec![ingress], "written:\n{written}");
}

proptest::proptest! {
    #[test]
    fn any_strings_survive_yaml_output(
        entries in proptest::collection::btree_map(".*", ".*", 0..6),
        host in ".*",
    ) {
        let mut ingress = support::ingress("ns", "n", Some(0), vec![support::rule(
            Some(&host),
            vec![support::path(&host, Some("Prefix"), "svc", 80)],
        )]);
        if let Some(meta) = ingress.metadata.as_mut() {
            meta.annotations = entries;
        }
        let written = manifest::to_yaml_string(std::slice::from_ref(&ingress)).expect("write");
        let back = manifest::from_yaml_str(&written).expect("reload");
        proptest::prop_assert_eq!(back, vec![ingress], "written:\n{}", written);
    }
}

#[test]
fn yaml_output_looks_like_kubectl() {
    let ingresses = manifest::from_yaml_str(KUBECTL_OUTPUT).expect("load");
    let written = manifest::to_yaml_string(&ingresses[1..]).expect("write");
    assert_eq!(
        written,
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  creationTimestamp: \"2024-03-02T08:00:00Z\"\n  name: fallback\n  namespace: retail\nspec:\n  defaultBackend:\n    service:\n      name: not-found\n      port:\n        number: 8080\nstatus:\n  loadBalancer: {}\n"
    );
}
