//! Field numbers pinned to the upstream Kubernetes schema: each case encodes one field and
//! compares with bytes written out by hand from the upstream `generated.proto` numbers, so an
//! accidental renumbering in `proto/` fails here even though a round trip would still pass.

use meshkit_ingress_model::k8s::io::api::core::v1::TypedLocalObjectReference;
use meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ListMeta, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use meshkit_ingress_model::k8s::io::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use meshkit_ingress_model::k8s::io::apimachinery::pkg::util::intstr::IntOrString;
use meshkit_ingress_model::{
    HttpIngressPath, Ingress, IngressBackend, IngressClassParametersReference,
    IngressLoadBalancerIngress, IngressPortStatus, IngressRule, IngressRuleValue, IngressSpec,
    IngressTls, ServiceBackendPort,
};
use prost::Message;

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

#[test]
fn networking_v1_field_numbers() {
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        (
            "Ingress.spec=2 / IngressSpec.ingressClassName=4",
            Ingress {
                spec: Some(IngressSpec {
                    ingress_class_name: s("c"),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec(),
            vec![0x12, 0x03, 0x22, 0x01, b'c'],
        ),
        (
            "IngressSpec.defaultBackend=1 tls=2 rules=3",
            IngressSpec {
                default_backend: Some(IngressBackend::default()),
                tls: vec![IngressTls::default()],
                rules: vec![IngressRule::default()],
                ingress_class_name: None,
            }
            .encode_to_vec(),
            vec![0x0a, 0x00, 0x12, 0x00, 0x1a, 0x00],
        ),
        (
            "IngressRule.host=1 ingressRuleValue=2 / IngressRuleValue.http=1",
            IngressRule {
                host: s("h"),
                ingress_rule_value: Some(IngressRuleValue {
                    http: Some(Default::default()),
                }),
            }
            .encode_to_vec(),
            vec![0x0a, 0x01, b'h', 0x12, 0x02, 0x0a, 0x00],
        ),
        (
            "HTTPIngressPath.path=1 backend=2 pathType=3",
            HttpIngressPath {
                path: s("/"),
                path_type: s("P"),
                backend: Some(IngressBackend::default()),
            }
            .encode_to_vec(),
            vec![0x0a, 0x01, b'/', 0x12, 0x00, 0x1a, 0x01, b'P'],
        ),
        (
            "IngressBackend.resource=3 service=4",
            IngressBackend {
                service: Some(Default::default()),
                resource: Some(TypedLocalObjectReference::default()),
            }
            .encode_to_vec(),
            vec![0x1a, 0x00, 0x22, 0x00],
        ),
        (
            "ServiceBackendPort.name=1 number=2",
            ServiceBackendPort {
                name: s("n"),
                number: Some(80),
            }
            .encode_to_vec(),
            vec![0x0a, 0x01, b'n', 0x10, 0x50],
        ),
        (
            "IngressTLS.hosts=1 secretName=2",
            IngressTls {
                hosts: vec!["h".into()],
                secret_name: s("s"),
            }
            .encode_to_vec(),
            vec![0x0a, 0x01, b'h', 0x12, 0x01, b's'],
        ),
        (
            "IngressLoadBalancerIngress.ip=1 hostname=2 ports=4 / IngressPortStatus.port=1 protocol=2 error=3",
            IngressLoadBalancerIngress {
                ip: s("i"),
                hostname: s("h"),
                ports: vec![IngressPortStatus {
                    port: Some(1),
                    protocol: s("T"),
                    error: s("e"),
                }],
            }
            .encode_to_vec(),
            vec![
                0x0a, 0x01, b'i', 0x12, 0x01, b'h', 0x22, 0x08, 0x08, 0x01, 0x12, 0x01, b'T', 0x1a,
                0x01, b'e',
            ],
        ),
        (
            "IngressClassParametersReference.aPIGroup=1 kind=2 name=3 scope=4 namespace=5",
            IngressClassParametersReference {
                a_pi_group: s("g"),
                kind: s("k"),
                name: s("n"),
                scope: s("s"),
                namespace: s("x"),
            }
            .encode_to_vec(),
            vec![
                0x0a, 0x01, b'g', 0x12, 0x01, b'k', 0x1a, 0x01, b'n', 0x22, 0x01, b's', 0x2a, 0x01,
                b'x',
            ],
        ),
        (
            "TypedLocalObjectReference.apiGroup=1 kind=2 name=3",
            TypedLocalObjectReference {
                api_group: s("g"),
                kind: s("k"),
                name: s("n"),
            }
            .encode_to_vec(),
            vec![0x0a, 0x01, b'g', 0x12, 0x01, b'k', 0x1a, 0x01, b'n'],
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn apimachinery_field_numbers() {
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        (
            "ObjectMeta.name=1 namespace=3 uid=5 creationTimestamp=8 / Time.seconds=1 nanos=2",
            ObjectMeta {
                name: s("a"),
                namespace: s("b"),
                uid: s("u"),
                creation_timestamp: Some(Time {
                    seconds: Some(1),
                    nanos: Some(2),
                }),
                ..Default::default()
            }
            .encode_to_vec(),
            vec![
                0x0a, 0x01, b'a', 0x1a, 0x01, b'b', 0x2a, 0x01, b'u', 0x42, 0x04, 0x08, 0x01, 0x10,
                0x02,
            ],
        ),
        (
            "ObjectMeta.generation=7 deletionGracePeriodSeconds=10 finalizers=14 managedFields=17",
            ObjectMeta {
                generation: Some(3),
                deletion_grace_period_seconds: Some(4),
                finalizers: vec!["f".into()],
                managed_fields: vec![ManagedFieldsEntry::default()],
                ..Default::default()
            }
            .encode_to_vec(),
            vec![0x38, 0x03, 0x50, 0x04, 0x72, 0x01, b'f', 0x8a, 0x01, 0x00],
        ),
        (
            "ObjectMeta.labels=11 annotations=12 (map entries key=1 value=2)",
            ObjectMeta {
                labels: [("k".to_owned(), "v".to_owned())].into(),
                annotations: [("a".to_owned(), "b".to_owned())].into(),
                ..Default::default()
            }
            .encode_to_vec(),
            vec![
                0x5a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v', 0x62, 0x06, 0x0a, 0x01, b'a', 0x12,
                0x01, b'b',
            ],
        ),
        (
            "ManagedFieldsEntry.manager=1 operation=2 apiVersion=3 time=4 fieldsType=6 fieldsV1=7 subresource=8",
            ManagedFieldsEntry {
                manager: s("m"),
                operation: s("o"),
                api_version: s("v"),
                time: Some(Time::default()),
                fields_type: s("t"),
                fields_v1: Some(FieldsV1 {
                    raw: Some(b"{}".to_vec()),
                }),
                subresource: s("s"),
            }
            .encode_to_vec(),
            vec![
                0x0a, 0x01, b'm', 0x12, 0x01, b'o', 0x1a, 0x01, b'v', 0x22, 0x00, 0x32, 0x01, b't',
                0x3a, 0x04, 0x0a, 0x02, b'{', b'}', 0x42, 0x01, b's',
            ],
        ),
        (
            "OwnerReference.kind=1 name=3 uid=4 apiVersion=5 controller=6 blockOwnerDeletion=7",
            OwnerReference {
                api_version: s("v"),
                kind: s("k"),
                name: s("n"),
                uid: s("u"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }
            .encode_to_vec(),
            vec![
                0x0a, 0x01, b'k', 0x1a, 0x01, b'n', 0x22, 0x01, b'u', 0x2a, 0x01, b'v', 0x30, 0x01,
                0x38, 0x01,
            ],
        ),
        (
            "ListMeta.selfLink=1 resourceVersion=2 continue=3 remainingItemCount=4",
            ListMeta {
                self_link: s("l"),
                resource_version: s("r"),
                r#continue: s("c"),
                remaining_item_count: Some(5),
            }
            .encode_to_vec(),
            vec![
                0x0a, 0x01, b'l', 0x12, 0x01, b'r', 0x1a, 0x01, b'c', 0x20, 0x05,
            ],
        ),
        (
            "runtime.Unknown.typeMeta=1 raw=2 contentEncoding=3 contentType=4 / runtime.TypeMeta.apiVersion=1 kind=2",
            Unknown {
                type_meta: Some(TypeMeta {
                    api_version: s("v"),
                    kind: s("k"),
                }),
                raw: Some(vec![7]),
                content_encoding: s("e"),
                content_type: s("t"),
            }
            .encode_to_vec(),
            vec![
                0x0a, 0x06, 0x0a, 0x01, b'v', 0x12, 0x01, b'k', 0x12, 0x01, 0x07, 0x1a, 0x01, b'e',
                0x22, 0x01, b't',
            ],
        ),
        (
            "IntOrString.type=1 intVal=2 strVal=3",
            IntOrString {
                r#type: Some(1),
                int_val: Some(2),
                str_val: s("x"),
            }
            .encode_to_vec(),
            vec![0x08, 0x01, 0x10, 0x02, 0x1a, 0x01, b'x'],
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, want, "{name}");
    }
}
