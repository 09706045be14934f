//! Every parser of untrusted input returns an error rather than panicking, on arbitrary
//! strings and bytes and on mutations of valid input.

use meshkit_ingress_model::envelope::{self, EnvelopeError};
use meshkit_ingress_model::k8s::io::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use meshkit_ingress_model::validation::{validate_ingress, validate_ingress_class};
use meshkit_ingress_model::{Ingress, IngressClass, IngressList, RouteTable, manifest};
use proptest::prelude::*;
use prost::Message;

const VALID_YAML: &str = include_str!("fixtures/kubectl-get-ingress.yaml");

/// The fixture's Ingresses as an `IngressList` in the Kubernetes encoding, with where the
/// envelope's parts are, laid out by hand here (not by the code under test): `k8s\0`, then
/// field 1 (`typeMeta`), then field 2 (`raw`, the object).
struct Fixture {
    list: IngressList,
    bytes: Vec<u8>,
    /// Where `typeMeta` ends and `raw` begins.
    type_meta_end: usize,
    /// Where `raw`'s payload (the object) begins.
    raw_start: usize,
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

impl Fixture {
    fn new() -> Self {
        let list = IngressList {
            metadata: None,
            items: manifest::from_yaml_str(VALID_YAML).expect("fixture"),
        };
        let type_meta = TypeMeta {
            api_version: Some("networking.k8s.io/v1".into()),
            kind: Some("IngressList".into()),
        }
        .encode_to_vec();
        let raw = list.encode_to_vec();
        let mut bytes = b"k8s\0".to_vec();
        bytes.push(0x0a);
        varint(type_meta.len(), &mut bytes);
        bytes.extend_from_slice(&type_meta);
        let type_meta_end = bytes.len();
        bytes.push(0x12);
        varint(raw.len(), &mut bytes);
        let raw_start = bytes.len();
        bytes.extend_from_slice(&raw);
        assert_eq!(
            envelope::encode(&list),
            bytes,
            "the encoding is not the documented one"
        );
        Self {
            list,
            bytes,
            type_meta_end,
            raw_start,
        }
    }

    /// An envelope of the fixture's object with another type and a content encoding.
    fn envelope(&self, api_version: &str, kind: &str, encoding: Option<&str>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.to_owned()),
                kind: Some(kind.to_owned()),
            }),
            raw: Some(self.bytes[self.raw_start..].to_vec()),
            content_encoding: encoding.map(str::to_owned),
            content_type: None,
        };
        let mut bytes = b"k8s\0".to_vec();
        unknown.encode(&mut bytes).expect("encode");
        bytes
    }
}

/// What decoding the fixture cut after `cut` bytes must give: the envelope ends inside the
/// magic or a field (truncated), or exactly between fields (missing fields read as empty).
#[test]
fn a_cut_envelope_is_truncated_unless_it_ends_between_fields() {
    let fixture = Fixture::new();
    let len = fixture.bytes.len();
    for cut in 0..=len {
        let got = envelope::decode::<IngressList>(&fixture.bytes[..cut]);
        let ok = match cut {
            // Inside the magic, inside `typeMeta`, inside `raw`.
            _ if cut < 4 || (4 < cut && cut < fixture.type_meta_end) => {
                matches!(got, Err(EnvelopeError::Truncated))
            }
            _ if fixture.type_meta_end < cut && cut < len => {
                matches!(got, Err(EnvelopeError::Truncated))
            }
            // The magic alone: no type at all.
            4 => matches!(
                &got,
                Err(EnvelopeError::WrongKind { api_version, kind, .. })
                    if api_version.is_empty() && kind.is_empty()
            ),
            // The type without the object: an empty list.
            _ if cut == fixture.type_meta_end => {
                matches!(&got, Ok(list) if *list == IngressList::default())
            }
            _ => matches!(&got, Ok(list) if *list == fixture.list),
        };
        assert!(ok, "cut after {cut} of {len} bytes: {got:?}");
    }
}

#[test]
fn a_changed_magic_is_wrong_magic() {
    let fixture = Fixture::new();
    for i in 0..4 {
        for x in 1..=255u8 {
            let mut bytes = fixture.bytes.clone();
            bytes[i] ^= x;
            let got = envelope::decode::<IngressList>(&bytes);
            assert!(
                matches!(got, Err(EnvelopeError::WrongMagic)),
                "byte {i} ^ {x:#x}: {got:?}"
            );
        }
    }
}

#[test]
fn another_kinds_envelope_is_wrong_kind() {
    let got = envelope::decode::<Ingress>(&Fixture::new().bytes);
    assert!(
        matches!(
            &got,
            Err(EnvelopeError::WrongKind { expected_kind: "Ingress", kind, .. }) if kind == "IngressList"
        ),
        "{got:?}"
    );
}

#[test]
fn an_invalid_wire_type_in_the_object_is_malformed_not_truncated() {
    let fixture = Fixture::new();
    // Field 1 with wire type 7 (no such type) before the object's own fields.
    for key in [0x0f_u8, 0x0e, 0x0b] {
        let mut raw = vec![key];
        raw.extend_from_slice(&fixture.bytes[fixture.raw_start..]);
        let mut bytes = fixture.bytes[..fixture.type_meta_end].to_vec();
        bytes.push(0x12);
        varint(raw.len(), &mut bytes);
        bytes.extend_from_slice(&raw);
        let got = envelope::decode::<IngressList>(&bytes);
        assert!(
            matches!(got, Err(EnvelopeError::Malformed(_))),
            "key {key:#x}: {got:?}"
        );
    }
}

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
    fn a_changed_kind_is_wrong_kind(api_version in "[a-zA-Z0-9./]{0,24}", kind in "[a-zA-Z]{0,16}") {
        let fixture = Fixture::new();
        let bytes = fixture.envelope(&api_version, &kind, None);
        let got = envelope::decode::<IngressList>(&bytes);
        if (api_version.as_str(), kind.as_str()) == ("networking.k8s.io/v1", "IngressList") {
            prop_assert_eq!(got.ok(), Some(fixture.list));
        } else {
            let wrong_kind = matches!(
                &got,
                Err(EnvelopeError::WrongKind { expected_api_version: "networking.k8s.io/v1", expected_kind: "IngressList", api_version: a, kind: k })
                    if *a == api_version && *k == kind
            );
            prop_assert!(wrong_kind, "{api_version} {kind}: {got:?}");
        }
    }

    #[test]
    fn a_content_encoding_is_unsupported(encoding in "[a-z0-9+-]{1,12}") {
        let fixture = Fixture::new();
        let bytes = fixture.envelope("networking.k8s.io/v1", "IngressList", Some(&encoding));
        let got = envelope::decode::<IngressList>(&bytes);
        prop_assert!(
            matches!(&got, Err(EnvelopeError::UnsupportedEncoding(e)) if *e == encoding),
            "{encoding}: {got:?}"
        );
    }

    /// Damage inside the object (the envelope intact) is the object's: the decoder answers
    /// what protobuf makes of the damaged object (the same list, or an object error), never
    /// an envelope error.
    #[test]
    fn damage_inside_the_object_is_reported_for_the_object(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 1..8),
    ) {
        let fixture = Fixture::new();
        let mut bytes = fixture.bytes.clone();
        for (index, value) in flips {
            let i = fixture.raw_start + index.index(bytes.len() - fixture.raw_start);
            bytes[i] ^= value;
        }
        let alone = IngressList::decode(&bytes[fixture.raw_start..]);
        match (envelope::decode::<IngressList>(&bytes), alone) {
            (Ok(list), Ok(alone)) => {
                prop_assert_eq!(&list, &alone);
                for ingress in &list.items {
                    let _ = validate_ingress(ingress);
                    let _ = manifest::to_yaml_string(std::slice::from_ref(ingress));
                }
                let table = RouteTable::new(&list.items);
                let _ = table.route("shop.example.com", "/api");
                let _ = table.tls_secret_for("shop.example.com");
            }
            (Err(EnvelopeError::Truncated | EnvelopeError::Malformed(_)), Err(_)) => {}
            (got, alone) => prop_assert!(false, "decoded {got:?}; the object alone: {alone:?}"),
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
