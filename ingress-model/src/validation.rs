//! Validation of Ingress and IngressClass objects by the API server's rules, with errors in
//! the Kubernetes style: `spec.rules[0].http.paths[1].path: Invalid value: "foo": must be an
//! absolute path`.
//!
//! ```
//! use meshkit_ingress_model::validation::validate_ingress;
//!
//! let ingress = meshkit_ingress_model::manifest::from_yaml_str(r#"
//! apiVersion: networking.k8s.io/v1
//! kind: Ingress
//! metadata: {name: web}
//! spec:
//!   rules:
//!   - host: "*.example.com"
//!     http:
//!       paths:
//!       - {path: api, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
//! "#)?.remove(0);
//! let errors = validate_ingress(&ingress).unwrap_err();
//! assert_eq!(
//!     errors.to_string(),
//!     r#"spec.rules[0].http.paths[0].path: Invalid value: "api": must be an absolute path"#
//! );
//! # Ok::<(), meshkit_ingress_model::manifest::ManifestError>(())
//! ```
//!
//! Covered: object names, label keys and values, annotation keys and total size; at least one of `rules` and `defaultBackend`; rule hosts (DNS-1123
//! subdomain or `*.` + subdomain, no IP address, no port, no bare `*`); `pathType` required and
//! supported; Exact and Prefix paths absolute and free of `//`, `/./`, `/../`, `%2f`, ending
//! `/..` or `/.`; ImplementationSpecific paths absolute when set; backends (service xor
//! resource, service name a DNS-1035 label, port name xor number, number 1 to 65535, valid
//! port name); TLS hosts and secret names; `ingressClassName`. For IngressClass: the
//! controller (required, at most 250 bytes, a domain-prefixed path) and the parameters
//! reference (kind and name required, scope `Cluster` or `Namespace` with the namespace rule).
//! Not covered: rules that need the previous object (updates) or cluster state.

use std::fmt;
use std::net::IpAddr;

use crate::k8s::io::api::core::v1::TypedLocalObjectReference;
use crate::k8s::io::api::networking::v1::{
    HttpIngressPath, Ingress, IngressBackend, IngressClass, IngressClassParametersReference,
    IngressServiceBackend, IngressTls,
};
use crate::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// One validation failure, with the path of the field, in the Kubernetes style.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// The value is malformed: `path: Invalid value: "value": detail`.
    #[error("{path}: Invalid value: {value:?}: {detail}")]
    Invalid {
        /// Field path, such as `spec.rules[0].host`.
        path: String,
        /// The offending value.
        value: String,
        /// Why it is invalid.
        detail: String,
    },
    /// A required field is missing: `path: Required value: detail`.
    #[error("{path}: Required value{}", detail_suffix(detail))]
    Required {
        /// Field path.
        path: String,
        /// What is required, may be empty.
        detail: String,
    },
    /// The value is not one of a fixed set: `path: Unsupported value: "x": supported values: ...`.
    #[error(
        "{path}: Unsupported value: {value:?}: supported values: {}",
        quoted_list(supported)
    )]
    NotSupported {
        /// Field path.
        path: String,
        /// The offending value.
        value: String,
        /// The values that are accepted.
        supported: Vec<&'static str>,
    },
    /// The field may not be set here: `path: Forbidden: detail`.
    #[error("{path}: Forbidden: {detail}")]
    Forbidden {
        /// Field path.
        path: String,
        /// Why it is forbidden.
        detail: String,
    },
    /// The value is too long: `path: Too long: may not be more than N bytes`.
    #[error("{path}: Too long: may not be more than {max} bytes")]
    TooLong {
        /// Field path.
        path: String,
        /// Maximum length in bytes.
        max: usize,
    },
}

/// All validation failures of one object, in field order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<FieldError>);

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

fn quoted_list(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

// === impl FieldError ===

impl FieldError {
    /// The path of the field, such as `spec.rules[0].http.paths[1].path`.
    pub fn path(&self) -> &str {
        match self {
            FieldError::Invalid { path, .. }
            | FieldError::Required { path, .. }
            | FieldError::NotSupported { path, .. }
            | FieldError::Forbidden { path, .. }
            | FieldError::TooLong { path, .. } => path,
        }
    }
}

// === impl ValidationErrors ===

impl ValidationErrors {
    /// The failures.
    pub fn errors(&self) -> &[FieldError] {
        &self.0
    }
}

impl fmt::Display for ValidationErrors {
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

impl std::error::Error for ValidationErrors {}

/// Collects errors while walking an object.
#[derive(Default)]
pub(crate) struct Errors(pub(crate) Vec<FieldError>);

impl Errors {
    pub(crate) fn invalid(
        &mut self,
        path: impl Into<String>,
        value: &str,
        detail: impl Into<String>,
    ) {
        self.0.push(FieldError::Invalid {
            path: path.into(),
            value: value.to_owned(),
            detail: detail.into(),
        });
    }

    pub(crate) fn required(&mut self, path: impl Into<String>, detail: impl Into<String>) {
        self.0.push(FieldError::Required {
            path: path.into(),
            detail: detail.into(),
        });
    }

    pub(crate) fn forbidden(&mut self, path: impl Into<String>, detail: impl Into<String>) {
        self.0.push(FieldError::Forbidden {
            path: path.into(),
            detail: detail.into(),
        });
    }

    pub(crate) fn finish(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(self.0))
        }
    }
}

const SUPPORTED_PATH_TYPES: &[&str] = &["Exact", "ImplementationSpecific", "Prefix"];
const INVALID_PATH_SEQUENCES: &[&str] = &["//", "/./", "/../", "%2f", "%2F"];
const INVALID_PATH_SUFFIXES: &[&str] = &["/..", "/."];
const MAX_CONTROLLER_LEN: usize = 250;
const MAX_ANNOTATIONS_SIZE: usize = 256 * 1024;

/// Validates an Ingress as the API server does on create.
///
/// # Errors
///
/// Every failing rule, each with its field path.
pub fn validate_ingress(ingress: &Ingress) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    validate_object_meta(ingress.metadata.as_ref(), true, &mut errs);
    let spec = ingress.spec.clone().unwrap_or_default();
    if spec.rules.is_empty() && spec.default_backend.is_none() {
        errs.invalid(
            "spec",
            "",
            "either `defaultBackend` or `rules` must be specified",
        );
    }
    if let Some(backend) = &spec.default_backend {
        validate_backend(backend, "spec.defaultBackend", &mut errs);
    }
    for (i, rule) in spec.rules.iter().enumerate() {
        let path = format!("spec.rules[{i}]");
        if let Some(host) = rule.host.as_deref().filter(|h| !h.is_empty()) {
            validate_rule_host(host, &format!("{path}.host"), &mut errs);
        }
        if let Some(http) = rule
            .ingress_rule_value
            .as_ref()
            .and_then(|v| v.http.as_ref())
        {
            let http_path = format!("{path}.http");
            if http.paths.is_empty() {
                errs.required(format!("{http_path}.paths"), "");
            }
            for (j, p) in http.paths.iter().enumerate() {
                validate_http_path(p, &format!("{http_path}.paths[{j}]"), &mut errs);
            }
        }
    }
    for (i, tls) in spec.tls.iter().enumerate() {
        validate_tls(tls, &format!("spec.tls[{i}]"), &mut errs);
    }
    if let Some(class) = spec.ingress_class_name.as_deref() {
        for msg in dns1123_subdomain_errors(class) {
            errs.invalid("spec.ingressClassName", class, msg);
        }
    }
    errs.finish()
}

/// Validates an IngressClass as the API server does on create.
///
/// # Errors
///
/// Every failing rule, each with its field path.
pub fn validate_ingress_class(class: &IngressClass) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    validate_object_meta(class.metadata.as_ref(), false, &mut errs);
    let spec = class.spec.clone().unwrap_or_default();
    match spec.controller.as_deref() {
        None | Some("") => errs.required("spec.controller", ""),
        Some(controller) if controller.len() > MAX_CONTROLLER_LEN => {
            errs.0.push(FieldError::TooLong {
                path: "spec.controller".into(),
                max: MAX_CONTROLLER_LEN,
            });
        }
        Some(controller) => {
            for msg in domain_prefixed_path_errors(controller) {
                errs.invalid("spec.controller", controller, msg);
            }
        }
    }
    if let Some(params) = &spec.parameters {
        validate_parameters(params, "spec.parameters", &mut errs);
    }
    errs.finish()
}

pub(crate) fn validate_object_meta(meta: Option<&ObjectMeta>, namespaced: bool, errs: &mut Errors) {
    let meta = meta.cloned().unwrap_or_default();
    match meta.name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => {
            for msg in dns1123_subdomain_errors(name) {
                errs.invalid("metadata.name", name, msg);
            }
        }
        None if meta.generate_name.as_deref().is_some_and(|g| !g.is_empty()) => {}
        None => errs.required("metadata.name", "name or generateName is required"),
    }
    for (key, value) in &meta.labels {
        for msg in qualified_name_errors(key) {
            errs.invalid("metadata.labels", key, msg);
        }
        for msg in label_value_errors(value) {
            errs.invalid("metadata.labels", value, msg);
        }
    }
    let mut annotations_size = 0usize;
    for (key, value) in &meta.annotations {
        for msg in qualified_name_errors(&key.to_ascii_lowercase()) {
            errs.invalid("metadata.annotations", key, msg);
        }
        annotations_size = annotations_size.saturating_add(key.len() + value.len());
    }
    if annotations_size > MAX_ANNOTATIONS_SIZE {
        errs.0.push(FieldError::TooLong {
            path: "metadata.annotations".into(),
            max: MAX_ANNOTATIONS_SIZE,
        });
    }
    if let Some(namespace) = meta.namespace.as_deref().filter(|n| !n.is_empty()) {
        if namespaced {
            for msg in dns1123_label_errors(namespace) {
                errs.invalid("metadata.namespace", namespace, msg);
            }
        } else {
            errs.forbidden("metadata.namespace", "not allowed on this type");
        }
    }
}

fn validate_rule_host(host: &str, path: &str, errs: &mut Errors) {
    if host.parse::<IpAddr>().is_ok() {
        errs.invalid(path, host, "must be a DNS name, not an IP address");
    }
    if host.contains('*') {
        for msg in wildcard_dns1123_subdomain_errors(host) {
            errs.invalid(path, host, msg);
        }
    } else {
        for msg in dns1123_subdomain_errors(host) {
            errs.invalid(path, host, msg);
        }
    }
}

fn validate_http_path(p: &HttpIngressPath, path: &str, errs: &mut Errors) {
    let value = p.path.as_deref().unwrap_or("");
    let path_field = format!("{path}.path");
    match p.path_type.as_deref() {
        None => errs.required(format!("{path}.pathType"), "pathType must be specified"),
        Some("Exact" | "Prefix") => {
            if !value.starts_with('/') {
                errs.invalid(&path_field, value, "must be an absolute path");
            }
            for seq in INVALID_PATH_SEQUENCES {
                if value.contains(seq) {
                    errs.invalid(&path_field, value, format!("must not contain '{seq}'"));
                }
            }
            for suffix in INVALID_PATH_SUFFIXES {
                if value.ends_with(suffix) {
                    errs.invalid(&path_field, value, format!("cannot end with '{suffix}'"));
                }
            }
        }
        Some("ImplementationSpecific") => {
            if !value.is_empty() && !value.starts_with('/') {
                errs.invalid(&path_field, value, "must be an absolute path");
            }
        }
        Some(other) => errs.0.push(FieldError::NotSupported {
            path: format!("{path}.pathType"),
            value: other.to_owned(),
            supported: SUPPORTED_PATH_TYPES.to_vec(),
        }),
    }
    match &p.backend {
        Some(backend) => validate_backend(backend, &format!("{path}.backend"), errs),
        None => errs.required(format!("{path}.backend"), ""),
    }
}

fn validate_backend(backend: &IngressBackend, path: &str, errs: &mut Errors) {
    match (&backend.service, &backend.resource) {
        (Some(_), Some(_)) => {
            errs.invalid(path, "", "cannot set both resource and service backends");
        }
        (Some(service), None) => {
            validate_service_backend(service, &format!("{path}.service"), errs)
        }
        (None, Some(resource)) => validate_resource(resource, &format!("{path}.resource"), errs),
        (None, None) => errs.invalid(path, "", "resource or service must be specified"),
    }
}

fn validate_service_backend(service: &IngressServiceBackend, path: &str, errs: &mut Errors) {
    match service.name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => {
            for msg in dns1035_label_errors(name) {
                errs.invalid(format!("{path}.name"), name, msg);
            }
        }
        None => errs.required(format!("{path}.name"), ""),
    }
    let port_path = format!("{path}.port");
    let port = service.port.clone().unwrap_or_default();
    let name = port.name.as_deref().filter(|n| !n.is_empty());
    match (name, port.number) {
        (Some(_), Some(_)) => {
            errs.invalid(&port_path, "", "cannot set both port name & port number")
        }
        (Some(name), None) => {
            for msg in port_name_errors(name) {
                errs.invalid(format!("{port_path}.name"), name, msg);
            }
        }
        (None, Some(number)) => {
            if !(1..=65535).contains(&number) {
                errs.invalid(
                    format!("{port_path}.number"),
                    &number.to_string(),
                    "must be between 1 and 65535, inclusive",
                );
            }
        }
        (None, None) => errs.required(&port_path, "port name or number is required"),
    }
}

fn validate_resource(resource: &TypedLocalObjectReference, path: &str, errs: &mut Errors) {
    if let Some(group) = resource.api_group.as_deref().filter(|g| !g.is_empty()) {
        for msg in dns1123_subdomain_errors(group) {
            errs.invalid(format!("{path}.apiGroup"), group, msg);
        }
    }
    validate_path_segment(resource.kind.as_deref(), &format!("{path}.kind"), errs);
    validate_path_segment(resource.name.as_deref(), &format!("{path}.name"), errs);
}

/// Kinds and names used in URL paths: required, not `.` or `..`, no `/` or `%`.
fn validate_path_segment(value: Option<&str>, path: &str, errs: &mut Errors) {
    match value.filter(|v| !v.is_empty()) {
        None => errs.required(path, ""),
        Some(v @ ("." | "..")) => errs.invalid(path, v, format!("may not be '{v}'")),
        Some(v) => {
            for bad in ["/", "%"] {
                if v.contains(bad) {
                    errs.invalid(path, v, format!("may not contain '{bad}'"));
                }
            }
        }
    }
}

fn validate_tls(tls: &IngressTls, path: &str, errs: &mut Errors) {
    for (i, host) in tls.hosts.iter().enumerate() {
        let host_path = format!("{path}.hosts[{i}]");
        let msgs = if host.contains('*') {
            wildcard_dns1123_subdomain_errors(host)
        } else {
            dns1123_subdomain_errors(host)
        };
        for msg in msgs {
            errs.invalid(&host_path, host, msg);
        }
    }
    if let Some(secret) = tls.secret_name.as_deref().filter(|s| !s.is_empty()) {
        for msg in dns1123_subdomain_errors(secret) {
            errs.invalid(format!("{path}.secretName"), secret, msg);
        }
    }
}

fn validate_parameters(params: &IngressClassParametersReference, path: &str, errs: &mut Errors) {
    if let Some(group) = params.a_pi_group.as_deref().filter(|g| !g.is_empty()) {
        for msg in dns1123_subdomain_errors(group) {
            errs.invalid(format!("{path}.apiGroup"), group, msg);
        }
    }
    validate_path_segment(params.kind.as_deref(), &format!("{path}.kind"), errs);
    validate_path_segment(params.name.as_deref(), &format!("{path}.name"), errs);
    let namespace = params.namespace.as_deref().filter(|n| !n.is_empty());
    match params.scope.as_deref() {
        // The API server defaults an unset scope to `Cluster`.
        None | Some("Cluster") => {
            if namespace.is_some() {
                errs.forbidden(
                    format!("{path}.namespace"),
                    "`parameters.scope` is set to 'Cluster'",
                );
            }
        }
        Some("Namespace") => match namespace {
            None => errs.required(
                format!("{path}.namespace"),
                "`parameters.scope` is set to 'Namespace'",
            ),
            Some(ns) => {
                for msg in dns1123_label_errors(ns) {
                    errs.invalid(format!("{path}.namespace"), ns, msg);
                }
            }
        },
        Some(other) => errs.0.push(FieldError::NotSupported {
            path: format!("{path}.scope"),
            value: other.to_owned(),
            supported: vec!["Cluster", "Namespace"],
        }),
    }
}

// === name rules (k8s.io/apimachinery/pkg/util/validation) ===

/// Lowercase alphanumerics and `-`, not empty, alphanumeric at both ends (length unchecked).
fn label_format_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(|c| *c != b'-')
        && b.last().is_some_and(|c| *c != b'-')
}

/// Errors for a DNS-1123 label: lowercase alphanumerics and `-`, at most 63, alphanumeric at
/// both ends.
pub(crate) fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    if !label_format_ok(s) {
        out.push(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
             '-', and must start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    out
}

/// Errors for a DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters.
pub(crate) fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 253 {
        out.push("must be no more than 253 characters".to_owned());
    }
    let labels_ok = s.split('.').all(label_format_ok);
    if !labels_ok {
        out.push(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, \
             '-' or '.', and must start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    out
}

/// Errors for a wildcard DNS-1123 subdomain: `*.` followed by a DNS-1123 subdomain.
pub(crate) fn wildcard_dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 253 {
        out.push("must be no more than 253 characters".to_owned());
    }
    let ok = s
        .strip_prefix("*.")
        .is_some_and(|rest| dns1123_subdomain_errors(rest).is_empty());
    if !ok {
        out.push(
            "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, \
             which must consist of lower case alphanumeric characters, '-' or '.' and end with an \
             alphanumeric character"
                .to_owned(),
        );
    }
    out
}

/// Errors for a DNS-1035 label (Service names): like a DNS-1123 label, starting with a letter.
pub(crate) fn dns1035_label_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    let first_is_letter = s.as_bytes().first().is_some_and(u8::is_ascii_lowercase);
    if !first_is_letter || !label_format_ok(s) {
        out.push(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start \
             with an alphabetic character, and end with an alphanumeric character"
                .to_owned(),
        );
    }
    out
}

/// Errors for a port name (IANA service name): at most 15 lowercase alphanumerics or `-`, at
/// least one letter, no `-` at either end nor two in a row.
pub(crate) fn port_name_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.is_empty() || s.len() > 15 {
        out.push("must be no more than 15 characters".to_owned());
    }
    if !s
        .bytes()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    {
        out.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_owned(),
        );
    }
    if s.contains("--") {
        out.push("must not contain consecutive hyphens".to_owned());
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        out.push("must contain at least one letter (a-z)".to_owned());
    }
    if s.starts_with('-') || s.ends_with('-') {
        out.push("must not begin or end with a hyphen".to_owned());
    }
    out
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, length unchecked.
fn qualified_part_ok(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Errors for a qualified name (label and annotation keys): an optional DNS-1123 subdomain
/// prefix and `/`, then a name of at most 63 characters.
fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, s),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            out.push("prefix part must be non-empty".to_owned());
        } else {
            out.extend(
                dns1123_subdomain_errors(prefix)
                    .into_iter()
                    .map(|m| format!("prefix part {m}")),
            );
        }
    }
    if name.is_empty() {
        out.push("name part must be non-empty".to_owned());
    } else {
        if name.len() > 63 {
            out.push("name part must be no more than 63 characters".to_owned());
        }
        if !qualified_part_ok(name) {
            out.push(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
                 start and end with an alphanumeric character"
                    .to_owned(),
            );
        }
    }
    out
}

/// Errors for a label value: empty, or at most 63 characters of the qualified-name alphabet.
fn label_value_errors(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    if s.len() > 63 {
        out.push("must be no more than 63 characters".to_owned());
    }
    if !s.is_empty() && !qualified_part_ok(s) {
        out.push(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', \
             '_' or '.', and must start and end with an alphanumeric character"
                .to_owned(),
        );
    }
    out
}

/// Errors for a domain-prefixed path such as `example.com/ingress-controller`.
fn domain_prefixed_path_errors(s: &str) -> Vec<String> {
    let Some((domain, path)) = s.split_once('/') else {
        return vec!["must be a domain-prefixed path (such as \"acme.io/foo\")".to_owned()];
    };
    let mut out = Vec::new();
    if path.is_empty() {
        out.push("must be a domain-prefixed path (such as \"acme.io/foo\")".to_owned());
    }
    out.extend(dns1123_subdomain_errors(domain));
    let path_ok = path
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&c));
    if !path_ok {
        out.push("path part must contain only valid HTTP path characters".to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_rules() {
        assert!(dns1123_label_errors("abc-1").is_empty());
        assert!(!dns1123_label_errors("-abc").is_empty());
        assert!(!dns1123_label_errors("Abc").is_empty());
        assert!(!dns1123_label_errors(&"a".repeat(64)).is_empty());
        assert!(dns1123_subdomain_errors("a.b-c.d").is_empty());
        assert!(!dns1123_subdomain_errors("a..b").is_empty());
        assert!(!dns1123_subdomain_errors("").is_empty());
        assert!(wildcard_dns1123_subdomain_errors("*.foo.com").is_empty());
        assert!(!wildcard_dns1123_subdomain_errors("*").is_empty());
        assert!(!wildcard_dns1123_subdomain_errors("foo.*.com").is_empty());
        assert!(dns1035_label_errors("web").is_empty());
        assert!(!dns1035_label_errors("1web").is_empty());
        assert!(port_name_errors("http").is_empty());
        assert!(!port_name_errors("8080").is_empty());
        assert!(!port_name_errors("a--b").is_empty());
        assert!(!port_name_errors("averyveryverylongname").is_empty());
        assert!(domain_prefixed_path_errors("example.com/ingress").is_empty());
        assert!(qualified_name_errors("app.kubernetes.io/name").is_empty());
        assert!(qualified_name_errors("Name_1.x").is_empty());
        assert!(!qualified_name_errors("/x").is_empty());
        assert!(!qualified_name_errors("a/b/c").is_empty());
        assert!(!qualified_name_errors("-x").is_empty());
        assert!(label_value_errors("").is_empty());
        assert!(!label_value_errors("a b").is_empty());
        assert!(!domain_prefixed_path_errors("ingress").is_empty());
    }
}
