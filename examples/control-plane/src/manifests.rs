//! Reading a folder of Kubernetes and Istio manifests into a [`ManifestSet`].
//!
//! Kinds read (others are skipped, so a folder shared with other tools works):
//!
//! | kind | apiVersion | what is kept |
//! |---|---|---|
//! | `Ingress` | `networking.k8s.io/v1` | the whole object, validated by the API server's rules |
//! | `IngressClass` | `networking.k8s.io/v1` | the whole object |
//! | `Secret` of type `kubernetes.io/tls` | `v1` | `tls.crt` and `tls.key` (`data`, base64, or `stringData`) |
//! | `ServiceEntry` | `networking.istio.io/v1`, `v1beta1`, `v1alpha3` | hosts, addresses, ports, workloadSelector |
//! | `WorkloadEntry` | `networking.istio.io/v1`, `v1beta1`, `v1alpha3` | address, serviceAccount, ports, labels, network |
//! | `AuthorizationPolicy` | `security.istio.io/v1`, `v1beta1` | selector, action, rules in L4 form, the `istio.io/dry-run` annotation (see [`policy`](crate::policy)) |
//! | `PeerAuthentication` | `security.istio.io/v1`, `v1beta1` | selector, mtls mode, portLevelMtls, creationTimestamp |
//! | `GatewayClass`, `Gateway`, `HTTPRoute` | `gateway.networking.k8s.io/v1`, `v1beta1` | the whole object, validated by the CRD's rules |
//! | `ReferenceGrant` | `gateway.networking.k8s.io/v1beta1`, `v1` | the whole object, validated by the CRD's rules |
//! | `Namespace`, `Node`, `Pod`, `Service` | `v1` | the whole object; [`ambient`](crate::ambient) derives workloads and services from them |
//! | `EndpointSlice` | `discovery.k8s.io/v1` | the whole object (the endpoints of Services without a selector) |
//!
//! A `List` document contributes its items. Files are the `*.yaml`, `*.yml` and `*.json` files
//! directly in the folder, read in name order; hidden files are ignored. Every problem is
//! reported as a [`ManifestError`] naming the file, the document (from 0) and the field, and
//! all problems of a folder are collected, not just the first.
//!
//! Meshkit-specific: a WorkloadEntry's node is its `meshkit.io/node` label (Istio has no such
//! field; node proxies use it to pick the workloads they serve).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use meshkit_ingress_model::gateway::manifest::GatewayApiObjects;
use meshkit_ingress_model::{Ingress, IngressClass};
use serde::Deserialize;
use serde_json::Value;

use crate::policy::{AuthorizationPolicy, Parsed, PeerAuthentication};

/// The label that names the node a WorkloadEntry runs on.
pub const NODE_LABEL: &str = "meshkit.io/node";

/// Nesting limit for YAML documents; Kubernetes objects are far shallower.
const MAX_YAML_DEPTH: usize = 128;

/// Everything the control plane reads from a manifest folder.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ManifestSet {
    /// Ingresses, validated.
    pub ingresses: Vec<Ingress>,
    /// IngressClasses.
    pub ingress_classes: Vec<IngressClass>,
    /// TLS secrets (`kubernetes.io/tls`).
    pub secrets: Vec<TlsSecret>,
    /// Istio ServiceEntries.
    pub service_entries: Vec<ServiceEntry>,
    /// Istio WorkloadEntries.
    pub workload_entries: Vec<WorkloadEntry>,
    /// Istio AuthorizationPolicies (those for node proxies; a waypoint's are skipped).
    pub authorization_policies: Vec<AuthorizationPolicy>,
    /// Istio PeerAuthentications.
    pub peer_authentications: Vec<PeerAuthentication>,
    /// Gateway API objects, validated.
    pub gateway_api: GatewayApiObjects,
    /// Kubernetes Namespaces (the system namespace's labels name the network).
    pub namespaces: Vec<Namespace>,
    /// Kubernetes Nodes (their labels give a Pod's locality).
    pub nodes: Vec<Node>,
    /// Kubernetes Pods, with their namespace set.
    pub pods: Vec<Pod>,
    /// Kubernetes Services, with their namespace set.
    pub services: Vec<Service>,
    /// Kubernetes EndpointSlices, with their namespace set.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// What was read but cannot be enforced as written (an AuthorizationPolicy's HTTP
    /// attributes), and what was skipped or left out; the load succeeds with these.
    pub warnings: Vec<ManifestError>,
    /// Of the warnings, the objects from the API server that the model refuses and leaves out
    /// (a manifest folder with one is an error instead).
    pub refused: Vec<ManifestError>,
    /// The kind, namespace and name of each core object added: a second of the same name is
    /// refused in constant time, however many there are.
    core_keys: HashSet<CoreKey>,
}

/// A core object's kind, namespace and name.
type CoreKey = (&'static str, Option<String>, String);

/// A `kubernetes.io/tls` Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsSecret {
    /// Namespace (`default` when absent).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `tls.crt`: the PEM certificate chain.
    pub cert_pem: Vec<u8>,
    /// `tls.key`: the PEM private key.
    pub key_pem: Vec<u8>,
}

/// An Istio ServiceEntry, reduced to what the control plane uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    /// Namespace (`default` when absent).
    pub namespace: String,
    /// Name; an Ingress backend `service.name` in the same namespace refers to it.
    pub name: String,
    /// Host names; the first is the service's hostname.
    pub hosts: Vec<String>,
    /// Virtual IPs.
    pub addresses: Vec<IpAddr>,
    /// Ports.
    pub ports: Vec<ServicePort>,
    /// Labels of the WorkloadEntries (same namespace) that back this service.
    pub workload_selector: BTreeMap<String, String>,
}

/// A port of a ServiceEntry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Port number of the service.
    pub number: u16,
    /// Port name (Ingress backends may refer to it).
    pub name: String,
    /// Protocol, such as `HTTP` or `TCP` (informational).
    pub protocol: String,
    /// Port on the workloads, when it differs from `number`.
    pub target_port: Option<u16>,
}

/// An Istio WorkloadEntry, reduced to what the control plane uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadEntry {
    /// Namespace (`default` when absent).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// IP address.
    pub address: IpAddr,
    /// Service account (`default` when absent); the identity is
    /// `spiffe://TD/ns/NAMESPACE/sa/SERVICE_ACCOUNT`.
    pub service_account: String,
    /// Port overrides by service port name.
    pub ports: BTreeMap<String, u16>,
    /// Labels, matched by ServiceEntry workload selectors.
    pub labels: BTreeMap<String, String>,
    /// Network (empty for the default network).
    pub network: String,
    /// Node, from the [`NODE_LABEL`] label.
    pub node: Option<String>,
}

/// A problem with a manifest: which file, which document, which field, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The file.
    pub file: PathBuf,
    /// Index of the YAML document in the file, from 0, when the problem is in one.
    pub document: Option<usize>,
    /// Path of the field, such as `spec.rules[0].http.paths[1].path`, when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

/// All problems found in one load; never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestErrors(pub Vec<ManifestError>);

// Raw serde forms of the Istio and core objects, with Kubernetes field names.

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct RawMeta {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) creation_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSecret {
    metadata: RawMeta,
    #[serde(rename = "type")]
    type_: String,
    data: BTreeMap<String, String>,
    string_data: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawServiceEntry {
    metadata: RawMeta,
    spec: RawServiceEntrySpec,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawServiceEntrySpec {
    hosts: Vec<String>,
    addresses: Vec<String>,
    ports: Vec<RawServicePort>,
    workload_selector: Option<RawSelector>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawSelector {
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawServicePort {
    number: u32,
    name: String,
    protocol: String,
    target_port: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawWorkloadEntry {
    metadata: RawMeta,
    spec: RawWorkloadEntrySpec,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawWorkloadEntrySpec {
    address: String,
    service_account: Option<String>,
    ports: BTreeMap<String, u32>,
    labels: BTreeMap<String, String>,
    network: String,
}

const SECURITY_VERSIONS: &[&str] = &["security.istio.io/v1", "security.istio.io/v1beta1"];

const ISTIO_VERSIONS: &[&str] = &[
    "networking.istio.io/v1",
    "networking.istio.io/v1beta1",
    "networking.istio.io/v1alpha3",
];

// === impl ManifestSet ===

impl ManifestSet {
    /// Reads every manifest file directly in `dir`.
    ///
    /// # Errors
    ///
    /// Every problem found: unreadable files, invalid YAML, bad fields, invalid Ingresses and
    /// objects defined twice.
    pub fn load_dir(dir: &Path) -> Result<Self, ManifestErrors> {
        let mut set = Self::default();
        let mut errors = Vec::new();
        match manifest_files(dir) {
            Ok(files) => {
                for file in files {
                    match std::fs::read_to_string(&file) {
                        Ok(text) => errors.extend(set.add_str(&file, &text)),
                        Err(e) => errors.push(ManifestError::file(&file, e.to_string())),
                    }
                }
            }
            Err(e) => errors.push(ManifestError::file(dir, e.to_string())),
        }
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(ManifestErrors(errors))
        }
    }

    /// Parses one (multi-document) YAML or JSON text and adds what it holds; `file` is only
    /// used in error reports. Returns the problems found; the objects without problems are
    /// added either way.
    pub fn add_str(&mut self, file: &Path, text: &str) -> Vec<ManifestError> {
        let options = serde_saphyr::Options {
            budget: Some(serde_saphyr::Budget {
                max_depth: MAX_YAML_DEPTH,
                ..serde_saphyr::Budget::default()
            }),
            ..serde_saphyr::Options::default()
        };
        let documents = match serde_saphyr::from_multiple_with_options::<Value>(text, options) {
            Ok(documents) => documents,
            Err(e) => return vec![ManifestError::file(file, format!("invalid YAML: {e}"))],
        };
        let mut errors = Vec::new();
        for (index, document) in documents.into_iter().enumerate() {
            let at = Location {
                file,
                document: Some(index),
            };
            self.add_value(&at, "", document, &mut errors);
        }
        errors
    }

    /// Adds one object as the Kubernetes API serves it (JSON with `apiVersion` and `kind`);
    /// `origin` names it in the problems reported (`Pod shop/api-0`, say). Returns the
    /// problems found; an object with one is left out.
    pub fn add_object(&mut self, origin: &str, object: Value) -> Vec<ManifestError> {
        let at = Location {
            file: Path::new(origin),
            document: None,
        };
        let mut errors = Vec::new();
        self.add_value(&at, "", object, &mut errors);
        errors
    }

    fn add_value(
        &mut self,
        at: &Location<'_>,
        prefix: &str,
        value: Value,
        errors: &mut Vec<ManifestError>,
    ) {
        if value.is_null() {
            return;
        }
        let Value::Object(mut map) = value else {
            errors.push(at.error(prefix, "not a mapping"));
            return;
        };
        let kind = map
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let api_version = map
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if kind.ends_with("List") {
            let Some(Value::Array(items)) = map.remove("items") else {
                return;
            };
            for (i, item) in items.into_iter().enumerate() {
                self.add_value(at, &format!("{prefix}items[{i}]."), item, errors);
            }
            return;
        }
        let value = Value::Object(map);
        let result = match (kind.as_str(), api_version.as_str()) {
            ("Ingress", _) => self.add_ingress(&value),
            (k, _) if meshkit_ingress_model::gateway::manifest::is_gateway_api_kind(k) => {
                self.add_gateway_api(value)
            }
            ("IngressClass", _) => self.add_ingress_class(&value),
            ("Secret", "v1") => self.add_secret(value),
            ("ServiceEntry", v) if ISTIO_VERSIONS.contains(&v) => self.add_service_entry(value),
            ("WorkloadEntry", v) if ISTIO_VERSIONS.contains(&v) => self.add_workload_entry(value),
            ("AuthorizationPolicy", v) if SECURITY_VERSIONS.contains(&v) => {
                match crate::policy::parse_authorization_policy(value) {
                    Ok(Parsed::Policy(policy, warnings)) => {
                        for (field, message) in warnings {
                            self.warnings
                                .push(at.error(&format!("{prefix}{field}"), &message));
                        }
                        self.add_authorization_policy(policy)
                    }
                    Ok(Parsed::Skipped(reason)) => {
                        self.warnings.push(at.error(prefix, &reason));
                        Ok(())
                    }
                    Err(problems) => Err(problems),
                }
            }
            ("PeerAuthentication", v) if SECURITY_VERSIONS.contains(&v) => {
                crate::policy::parse_peer_authentication(value)
                    .and_then(|p| self.add_peer_authentication(p))
            }
            ("Namespace", "v1") => add_core(
                &mut self.namespaces,
                &mut self.core_keys,
                "Namespace",
                value,
                false,
            ),
            ("Node", "v1") => add_core(&mut self.nodes, &mut self.core_keys, "Node", value, false),
            ("Pod", "v1") => {
                let mut value = value;
                crate::ambient::trim_pod(&mut value);
                add_core(&mut self.pods, &mut self.core_keys, "Pod", value, true)
            }
            ("Service", "v1") => add_core(
                &mut self.services,
                &mut self.core_keys,
                "Service",
                value,
                true,
            ),
            ("EndpointSlice", "discovery.k8s.io/v1") => add_core(
                &mut self.endpoint_slices,
                &mut self.core_keys,
                "EndpointSlice",
                value,
                true,
            ),
            ("AuthorizationPolicy" | "PeerAuthentication", v) => Err(vec![(
                "apiVersion".to_owned(),
                format!(
                    "{kind} with apiVersion {v:?} is not supported (security.istio.io/v1 or v1beta1)"
                ),
            )]),
            ("ServiceEntry" | "WorkloadEntry", v) => Err(vec![(
                "apiVersion".to_owned(),
                format!(
                    "{kind} with apiVersion {v:?} is not supported (networking.istio.io/v1 or v1beta1)"
                ),
            )]),
            _ => Ok(()),
        };
        if let Err(problems) = result {
            for (field, message) in problems {
                errors.push(at.error(&format!("{prefix}{field}"), &message));
            }
        }
    }

    fn add_ingress(&mut self, value: &Value) -> Result<(), Vec<(String, String)>> {
        use meshkit_ingress_model::manifest::{ManifestError as M, from_json_str};
        let text = value.to_string();
        let ingresses = from_json_str(&text).map_err(|e| match e {
            M::Field { path, message, .. } => vec![(path, message)],
            M::UnsupportedVersion { api_version, .. } => vec![(
                "apiVersion".to_owned(),
                format!("Ingress with apiVersion {api_version:?} is not supported (networking.k8s.io/v1)"),
            )],
            other => vec![(String::new(), other.to_string())],
        })?;
        for ingress in ingresses {
            meshkit_ingress_model::validation::validate_ingress(&ingress).map_err(|errors| {
                errors
                    .errors()
                    .iter()
                    .map(|e| (e.path().to_owned(), e.to_string()))
                    .collect::<Vec<_>>()
            })?;
            let key = ingress_name(&ingress);
            if self.ingresses.iter().any(|i| ingress_name(i) == key) {
                return Err(defined_twice("Ingress", &key));
            }
            self.ingresses.push(ingress);
        }
        Ok(())
    }

    fn add_gateway_api(&mut self, value: Value) -> Result<(), Vec<(String, String)>> {
        use meshkit_ingress_model::gateway::{manifest, validation};
        use meshkit_ingress_model::manifest::ManifestError as M;
        let mut objects = manifest::from_json_value(value).map_err(|e| match e {
            M::Field { path, message, .. } => vec![(path, message)],
            M::UnsupportedVersion {
                kind,
                api_version,
                supported,
                ..
            } => vec![(
                "apiVersion".to_owned(),
                format!("{kind} with apiVersion {api_version:?} is not supported ({supported})"),
            )],
            other => vec![(String::new(), other.to_string())],
        })?;
        let problems = |errors: meshkit_ingress_model::validation::ValidationErrors| {
            errors
                .errors()
                .iter()
                .map(|e| (e.path().to_owned(), e.to_string()))
                .collect::<Vec<_>>()
        };
        // `namespace/name`, or the name alone for the cluster-scoped GatewayClass.
        let key = |meta: &meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            let name = meta.name.as_deref().unwrap_or("");
            match meta.namespace.as_deref() {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_owned(),
            }
        };
        // Namespaced objects without a namespace are in `default`, as everything else here.
        for meta in objects
            .gateways
            .iter_mut()
            .map(|o| &mut o.metadata)
            .chain(objects.http_routes.iter_mut().map(|o| &mut o.metadata))
            .chain(objects.reference_grants.iter_mut().map(|o| &mut o.metadata))
        {
            if meta.namespace.as_deref().is_none_or(str::is_empty) {
                meta.namespace = Some("default".to_owned());
            }
        }
        let existing = &self.gateway_api;
        for o in &objects.gateway_classes {
            validation::validate_gateway_class(o).map_err(problems)?;
            if existing
                .gateway_classes
                .iter()
                .any(|e| key(&e.metadata) == key(&o.metadata))
            {
                return Err(defined_twice("GatewayClass", &key(&o.metadata)));
            }
        }
        for o in &objects.gateways {
            validation::validate_gateway(o).map_err(problems)?;
            if existing
                .gateways
                .iter()
                .any(|e| key(&e.metadata) == key(&o.metadata))
            {
                return Err(defined_twice("Gateway", &key(&o.metadata)));
            }
        }
        for o in &objects.http_routes {
            validation::validate_http_route(o).map_err(problems)?;
            if existing
                .http_routes
                .iter()
                .any(|e| key(&e.metadata) == key(&o.metadata))
            {
                return Err(defined_twice("HTTPRoute", &key(&o.metadata)));
            }
        }
        for o in &objects.reference_grants {
            validation::validate_reference_grant(o).map_err(problems)?;
            if existing
                .reference_grants
                .iter()
                .any(|e| key(&e.metadata) == key(&o.metadata))
            {
                return Err(defined_twice("ReferenceGrant", &key(&o.metadata)));
            }
        }
        self.gateway_api.extend(objects);
        Ok(())
    }

    fn add_ingress_class(&mut self, value: &Value) -> Result<(), Vec<(String, String)>> {
        use meshkit_ingress_model::manifest::{ManifestError as M, ingress_classes_from_yaml_str};
        // JSON is YAML: the model's reader handles the apiVersion check and field paths.
        let classes = ingress_classes_from_yaml_str(&value.to_string()).map_err(|e| match e {
            M::Field { path, message, .. } => vec![(path, message)],
            other => vec![(String::new(), other.to_string())],
        })?;
        self.ingress_classes.extend(classes);
        Ok(())
    }

    fn add_secret(&mut self, value: Value) -> Result<(), Vec<(String, String)>> {
        let raw: RawSecret = deserialize(value)?;
        if raw.type_ != "kubernetes.io/tls" {
            return Ok(());
        }
        check_name(&raw.metadata)?;
        let field = |key: &str| -> Result<Vec<u8>, Vec<(String, String)>> {
            if let Some(text) = raw.string_data.get(key) {
                return Ok(text.as_bytes().to_vec());
            }
            let Some(encoded) = raw.data.get(key) else {
                return Err(one(
                    &format!("data.{key}"),
                    "required for a kubernetes.io/tls Secret",
                ));
            };
            let compact: String = encoded.split_whitespace().collect();
            base64::engine::general_purpose::STANDARD
                .decode(compact)
                .map_err(|e| one(&format!("data.{key}"), &format!("invalid base64: {e}")))
        };
        let cert_pem = field("tls.crt")?;
        let key_pem = field("tls.key")?;
        if !cert_pem.starts_with(b"-----BEGIN") {
            return Err(one("data.tls.crt", "not a PEM certificate"));
        }
        if !key_pem.starts_with(b"-----BEGIN") {
            return Err(one("data.tls.key", "not a PEM private key"));
        }
        let ns = namespace(&raw.metadata);
        if self
            .secrets
            .iter()
            .any(|s| s.namespace == ns && s.name == raw.metadata.name)
        {
            return Err(defined_twice(
                "Secret",
                &format!("{ns}/{}", raw.metadata.name),
            ));
        }
        self.secrets.push(TlsSecret {
            namespace: ns,
            name: raw.metadata.name,
            cert_pem,
            key_pem,
        });
        Ok(())
    }

    fn add_service_entry(&mut self, value: Value) -> Result<(), Vec<(String, String)>> {
        let raw: RawServiceEntry = deserialize(value)?;
        check_name(&raw.metadata)?;
        let mut problems = Vec::new();
        if raw.spec.hosts.is_empty() {
            problems.push((
                "spec.hosts".to_owned(),
                "at least one host is required".to_owned(),
            ));
        }
        for (i, host) in raw.spec.hosts.iter().enumerate() {
            if host.is_empty() || host.contains('/') || host.contains(' ') {
                problems.push((
                    format!("spec.hosts[{i}]"),
                    format!("{host:?} is not a host name"),
                ));
            }
        }
        let mut addresses = Vec::new();
        for (i, address) in raw.spec.addresses.iter().enumerate() {
            match address.parse::<IpAddr>() {
                Ok(ip) => addresses.push(ip),
                Err(_) => problems.push((
                    format!("spec.addresses[{i}]"),
                    format!("{address:?} is not an IP address"),
                )),
            }
        }
        let mut ports = Vec::new();
        for (i, port) in raw.spec.ports.iter().enumerate() {
            let number = port_number(port.number);
            let target = port.target_port.map(port_number);
            if number.is_none() {
                problems.push((
                    format!("spec.ports[{i}].number"),
                    format!("{} is not a port number (1-65535)", port.number),
                ));
            }
            if let Some(None) = target {
                problems.push((
                    format!("spec.ports[{i}].targetPort"),
                    "not a port number (1-65535)".to_owned(),
                ));
            }
            if let (Some(number), Some(target_port)) = (number, target.unwrap_or(Some(0))) {
                ports.push(ServicePort {
                    number,
                    name: port.name.clone(),
                    protocol: port.protocol.clone(),
                    target_port: (target_port != 0).then_some(target_port),
                });
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let ns = namespace(&raw.metadata);
        if self
            .service_entries
            .iter()
            .any(|s| s.namespace == ns && s.name == raw.metadata.name)
        {
            return Err(defined_twice(
                "ServiceEntry",
                &format!("{ns}/{}", raw.metadata.name),
            ));
        }
        self.service_entries.push(ServiceEntry {
            namespace: ns,
            name: raw.metadata.name,
            hosts: raw.spec.hosts,
            addresses,
            ports,
            workload_selector: raw
                .spec
                .workload_selector
                .map(|s| s.labels)
                .unwrap_or_default(),
        });
        Ok(())
    }

    fn add_workload_entry(&mut self, value: Value) -> Result<(), Vec<(String, String)>> {
        let raw: RawWorkloadEntry = deserialize(value)?;
        check_name(&raw.metadata)?;
        let mut problems = Vec::new();
        let address = match raw.spec.address.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => {
                problems.push((
                    "spec.address".to_owned(),
                    format!(
                        "{:?} is not an IP address (host names are not supported)",
                        raw.spec.address
                    ),
                ));
                None
            }
        };
        let service_account = raw
            .spec
            .service_account
            .unwrap_or_else(|| "default".to_owned());
        if !is_dns_label(&service_account) {
            problems.push((
                "spec.serviceAccount".to_owned(),
                format!("{service_account:?} is not a valid service account name"),
            ));
        }
        let mut ports = BTreeMap::new();
        for (name, &number) in &raw.spec.ports {
            match port_number(number) {
                Some(port) => {
                    ports.insert(name.clone(), port);
                }
                None => problems.push((
                    format!("spec.ports.{name}"),
                    format!("{number} is not a port number (1-65535)"),
                )),
            }
        }
        let (Some(address), true) = (address, problems.is_empty()) else {
            return Err(problems);
        };
        let ns = namespace(&raw.metadata);
        if self
            .workload_entries
            .iter()
            .any(|w| w.namespace == ns && w.name == raw.metadata.name)
        {
            return Err(defined_twice(
                "WorkloadEntry",
                &format!("{ns}/{}", raw.metadata.name),
            ));
        }
        if let Some(other) = self
            .workload_entries
            .iter()
            .find(|w| w.address == address && w.network == raw.spec.network)
        {
            return Err(one(
                "spec.address",
                &format!(
                    "{address} is already the address of WorkloadEntry {}/{}",
                    other.namespace, other.name
                ),
            ));
        }
        let mut labels = raw.metadata.labels.clone();
        labels.extend(raw.spec.labels);
        self.workload_entries.push(WorkloadEntry {
            namespace: ns,
            node: labels.get(NODE_LABEL).cloned(),
            name: raw.metadata.name,
            address,
            service_account,
            ports,
            labels,
            network: raw.spec.network,
        });
        Ok(())
    }
}

impl ManifestSet {
    fn add_authorization_policy(
        &mut self,
        p: AuthorizationPolicy,
    ) -> Result<(), Vec<(String, String)>> {
        if self
            .authorization_policies
            .iter()
            .any(|o| o.namespace == p.namespace && o.name == p.name)
        {
            return Err(defined_twice(
                "AuthorizationPolicy",
                &format!("{}/{}", p.namespace, p.name),
            ));
        }
        self.authorization_policies.push(p);
        Ok(())
    }

    fn add_peer_authentication(
        &mut self,
        p: PeerAuthentication,
    ) -> Result<(), Vec<(String, String)>> {
        if self
            .peer_authentications
            .iter()
            .any(|o| o.namespace == p.namespace && o.name == p.name)
        {
            return Err(defined_twice(
                "PeerAuthentication",
                &format!("{}/{}", p.namespace, p.name),
            ));
        }
        self.peer_authentications.push(p);
        Ok(())
    }
}

struct Location<'a> {
    file: &'a Path,
    document: Option<usize>,
}

impl Location<'_> {
    fn error(&self, field: &str, message: &str) -> ManifestError {
        let field = field.trim_end_matches('.');
        ManifestError {
            file: self.file.to_path_buf(),
            document: self.document,
            field: (!field.is_empty()).then(|| field.to_owned()),
            message: message.to_owned(),
        }
    }
}

/// A Kubernetes object kept whole; one that is namespaced is in `default` when it names no
/// namespace.
trait Object: serde::de::DeserializeOwned {
    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

macro_rules! object {
    ($($t:ty),*) => {$(
        impl Object for $t {
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    )*};
}
object!(Namespace, Node, Pod, Service, EndpointSlice);

fn add_core<T: Object>(
    into: &mut Vec<T>,
    keys: &mut HashSet<CoreKey>,
    kind: &'static str,
    value: Value,
    namespaced: bool,
) -> Result<(), Vec<(String, String)>> {
    let mut object: T = deserialize(value)?;
    let meta = object.meta_mut();
    if namespaced && meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".to_owned());
    }
    // The API server has validated the names of what it serves; a file's are only required.
    let Some(name) = meta.name.clone().filter(|n| !n.is_empty()) else {
        return Err(one("metadata.name", "required"));
    };
    if !keys.insert((kind, meta.namespace.clone(), name.clone())) {
        let name = match &object.meta().namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        };
        return Err(defined_twice(kind, &name));
    }
    into.push(object);
    Ok(())
}

fn defined_twice(kind: &str, key: &str) -> Vec<(String, String)> {
    one(
        "metadata.name",
        &format!("{kind} {key} is defined more than once"),
    )
}

fn ingress_name(ingress: &Ingress) -> String {
    let meta = ingress.metadata.as_ref();
    format!(
        "{}/{}",
        meta.and_then(|m| m.namespace.as_deref())
            .unwrap_or("default"),
        meta.and_then(|m| m.name.as_deref()).unwrap_or("")
    )
}

fn one(field: &str, message: &str) -> Vec<(String, String)> {
    vec![(field.to_owned(), message.to_owned())]
}

pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(
    mut value: Value,
) -> Result<T, Vec<(String, String)>> {
    drop_nulls(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        vec![(path, e.into_inner().to_string())]
    })
}

/// A `null` field counts as absent, as in Kubernetes.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

pub(crate) fn check_name(meta: &RawMeta) -> Result<(), Vec<(String, String)>> {
    if meta.name.is_empty() {
        return Err(one("metadata.name", "required"));
    }
    if !is_dns_label(&meta.name.replace('.', "-")) {
        return Err(one(
            "metadata.name",
            &format!("{:?} is not a valid object name", meta.name),
        ));
    }
    if let Some(ns) = &meta.namespace
        && !is_dns_label(ns)
    {
        return Err(one(
            "metadata.namespace",
            &format!("{ns:?} is not a valid namespace"),
        ));
    }
    Ok(())
}

pub(crate) fn namespace(meta: &RawMeta) -> String {
    meta.namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned())
}

/// RFC 1123 label: lowercase letters, digits and `-`, at most 63, not starting or ending
/// with `-`.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn port_number(n: u32) -> Option<u16> {
    u16::try_from(n).ok().filter(|&p| p != 0)
}

fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let wanted = !name.starts_with('.')
            && [".yaml", ".yml", ".json"]
                .iter()
                .any(|ext| name.ends_with(ext))
            && path.is_file();
        if wanted {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

// === impl ManifestError ===

impl ManifestError {
    fn file(file: &Path, message: String) -> Self {
        Self {
            file: file.to_path_buf(),
            document: None,
            field: None,
            message,
        }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.file.as_os_str().is_empty() {
            write!(f, "{}: ", self.file.display())?;
        }
        if let Some(document) = self.document {
            write!(f, "document {document}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ManifestError {}

// === impl ManifestErrors ===

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ManifestErrors {}

// === impl TlsSecret ===

impl fmt::Debug for TlsSecret {
    /// Leaves the key out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("cert_pem_len", &self.cert_pem.len())
            .finish_non_exhaustive()
    }
}

// === impl WorkloadEntry ===

impl WorkloadEntry {
    /// Whether every label of `selector` is on this workload (an empty selector selects none).
    pub fn matches(&self, selector: &BTreeMap<String, String>) -> bool {
        !selector.is_empty() && self.has_labels(selector)
    }

    /// Whether every label of `labels` is on this workload (true for none: a policy's empty
    /// `matchLabels` selects every workload of its namespace).
    pub fn has_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        labels.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}
