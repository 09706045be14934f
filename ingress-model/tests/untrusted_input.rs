//! Every parser of untrusted input returns an error rather than panicking, on arbitrary
//! strings and bytes and on mutations of valid input.

use meshkit_ingress_model::envelope::{self, EnvelopeError};
use meshkit_ingress_model::validation::{validate_ingress, validate_ingress_class};
use meshkit_ingress_model::{Ingress, IngressClass, IngressList, RouteTable, manifest};
use proptest::prelude::*;

const VALID_YAML: &str = include_str!("fixtures/kubectl-get-ingress.yaml");

/// YAML-ish text assembled from fragments that reach deep into the Ingress schema.
fn yamlish() -> impl Strategy<Value = String> {
    let fragments = prop::sample::select(vec![
        "apiVersion: networking.k8s.io/v1\n",
        "kind: Ingress\n",
        "kind: IngressList\n",
        "kind: List\n",
        "items:\n",
        "- ",
        "metadata:\n",
        "  name: x\n",
        "  creationTimestamp: 2024-01-01T00:00:00Z\n",
        "  creationTimestamp: 99999-01-01T00:00:00Z\n",
        "  managedFields:\n  - fieldsV1: {a: [1, null]}\n",
        "spec:\n",
        "  rules:\n",
        "  - host: a.com\n",
        "    http:\n",
        "      paths:\n",
        "      - path: /\n",
        "        pathType: Prefix\n",
        "        backend: {service: {name: s, port: {number: 99999999999}}}\n",
        "        backend: {service: {name: s, port: {name: 7}}}\n",
        "  defaultBackend: null\n",
        "  tls: [{hosts: [\"*\"]}]\n",
        "---\n",
        "  ",
        ": ",
        "[",
        "{",
        "&a ",
        "*a ",
        "!!binary ",
        "\"\\u0000\"",
        "~\n",
    ]);
    prop::collection::vec(fragments, 0..40).prop_map(|parts| parts.concat())
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        any::<f64>().prop_map(|n| serde_json::json!(n)),
        "[a-zA-Z0-9:/*. -]{0,12}".prop_map(serde_json::Value::String),
    ];
    let keys = prop::sample::select(vec![
        "metadata",
        "spec",
        "status",
        "rules",
        "host",
        "http",
        "paths",
        "path",
        "pathType",
        "backend",
        "service",
        "name",
        "port",
        "number",
        "resource",
        "tls",
        "hosts",
        "secretName",
        "defaultBackend",
        "creationTimestamp",
        "annotations",
        "managedFields",
        "fieldsV1",
        "loadBalancer",
        "ingress",
        "ports",
        "ingressClassName",
    ]);
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(keys.clone().prop_map(str::to_owned), inner, 0..5)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn yaml_loader_never_panics(text in any::<String>()) {
        let _ = manifest::from_yaml_str(&text);
        let _ = manifest::ingress_classes_from_yaml_str(&text);
    }

    #[test]
    fn yaml_loader_never_panics_on_schema_shaped_text(text in yamlish()) {
        if let Ok(ingresses) = manifest::from_yaml_str(&text) {
            for ingress in &ingresses {
                let _ = validate_ingress(ingress);
            }
            let _ = manifest::to_yaml_string(&ingresses);
            let _ = RouteTable::new(&ingresses).route("a.com", "/");
        }
    }

    #[test]
    fn json_loader_never_panics(text in any::<String>()) {
        let _ = manifest::from_json_str(&text);
    }

    #[test]
    fn json_loader_never_panics_on_ingress_shaped_values(value in json_value()) {
        let mut object = serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress"});
        if let (Some(target), serde_json::Value::Object(fields)) = (object.as_object_mut(), value) {
            target.extend(fields);
        }
        if let Ok(ingresses) = manifest::from_json_str(&object.to_string()) {
            for ingress in &ingresses {
                let _ = validate_ingress(ingress);
                let _ = manifest::to_json_string(ingress);
            }
        }
    }

    #[test]
    fn envelope_decoder_never_panics(mut bytes in prop::collection::vec(any::<u8>(), 0..256), magic in any::<bool>()) {
        if magic {
            let mut with_magic = envelope::MAGIC.to_vec();
            with_magic.append(&mut bytes);
            bytes = with_magic;
        }
        let _ = envelope::decode_unknown(&bytes);
        let _ = envelope::decode::<Ingress>(&bytes);
        let _ = envelope::decode::<IngressList>(&bytes);
        let _ = envelope::decode::<IngressClass>(&bytes);
    }

    #[test]
    fn envelope_decoder_never_panics_on_mutated_objects(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let ingresses = manifest::from_yaml_str(VALID_YAML).expect("fixture");
        let mut bytes = envelope::encode(&IngressList { metadata: None, items: ingresses });
        for (index, value) in flips {
            let i = index.index(bytes.len());
            bytes[i] ^= value;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        match envelope::decode::<IngressList>(&bytes) {
            Ok(list) => {
                for ingress in &list.items {
                    let _ = validate_ingress(ingress);
                    let _ = manifest::to_yaml_string(std::slice::from_ref(ingress));
                }
                let table = RouteTable::new(&list.items);
                let _ = table.route("shop.example.com", "/api");
                let _ = table.tls_secret_for("shop.example.com");
            }
            Err(EnvelopeError::WrongMagic | EnvelopeError::Truncated | EnvelopeError::WrongKind { .. }
                | EnvelopeError::UnsupportedEncoding(_) | EnvelopeError::Malformed(_)) => {}
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }

    #[test]
    fn route_lookup_never_panics(host in any::<String>(), path in any::<String>()) {
        let ingresses = manifest::from_yaml_str(VALID_YAML).expect("fixture");
        let table = RouteTable::new(&ingresses);
        let _ = table.route(&host, &path);
        let _ = table.tls_secret_for(&host);
        let long = host.repeat(40);
        let _ = table.route(&long, &path);
    }

    #[test]
    fn ingress_class_validation_never_panics(value in json_value()) {
        let mut object = serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass"});
        if let (Some(target), serde_json::Value::Object(fields)) = (object.as_object_mut(), value) {
            target.extend(fields);
        }
        let yaml = object.to_string();
        if let Ok(classes) = manifest::ingress_classes_from_yaml_str(&yaml) {
            for class in &classes {
                let _ = validate_ingress_class(class);
            }
        }
    }
}

#[test]
fn deeply_nested_yaml_is_an_error_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(manifest::from_yaml_str(&deep).is_err());
    let deep_json = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(manifest::from_json_str(&deep_json).is_err());
}
