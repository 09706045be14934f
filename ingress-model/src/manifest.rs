//! Reading and writing Ingress manifests in Kubernetes JSON and YAML.
//!
//! Field names are the Kubernetes JSON ones (camelCase), `IntOrString` is a bare number or
//! string, timestamps are RFC 3339. Input may be what `kubectl get ingress -o yaml` prints
//! (a `List` or `IngressList` whose items are Ingresses) or hand-written multi-document YAML;
//! documents of other kinds are skipped. A `null` field counts as absent, as in Kubernetes.
//!
//! ```
//! let yaml = r#"
//! apiVersion: v1
//! kind: ConfigMap
//! metadata: {name: skipped}
//! ---
//! apiVersion: networking.k8s.io/v1
//! kind: Ingress
//! metadata: {name: web, namespace: shop}
//! spec:
//!   rules:
//!   - host: shop.example.com
//!     http:
//!       paths:
//!       - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
//! "#;
//! let ingresses = meshkit_ingress_model::manifest::from_yaml_str(yaml)?;
//! assert_eq!(ingresses.len(), 1);
//! let again = meshkit_ingress_model::manifest::from_yaml_str(
//!     &meshkit_ingress_model::manifest::to_yaml_string(&ingresses)?,
//! )?;
//! assert_eq!(again, ingresses);
//! # Ok::<(), meshkit_ingress_model::manifest::ManifestError>(())
//! ```

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::envelope::Kind;
use crate::k8s::io::api::networking::v1::{Ingress, IngressClass};

/// Why a manifest could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The text is not valid YAML.
    #[error("invalid YAML: {0}")]
    Yaml(String),
    /// The text is not valid JSON.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// A document (or a list item) is not a mapping.
    #[error("document {document}{item}: not a mapping", item = fmt_item(*.item))]
    NotAnObject {
        /// Index of the document in the input, from 0.
        document: usize,
        /// Index in `items` when the object is a list item.
        item: Option<usize>,
    },
    /// An object of the right kind has an API version this crate does not read.
    #[error(
        "document {document}{item}: {kind} with apiVersion {api_version:?} is not supported (only {supported})",
        item = fmt_item(*.item)
    )]
    UnsupportedVersion {
        /// Index of the document in the input, from 0.
        document: usize,
        /// Index in `items` when the object is a list item.
        item: Option<usize>,
        /// The kind.
        kind: String,
        /// The API version found.
        api_version: String,
        /// The API versions this crate reads for the kind.
        supported: &'static str,
    },
    /// A field has the wrong type or an invalid value.
    #[error("document {document}{item}: {path}: {message}", item = fmt_item(*.item))]
    Field {
        /// Index of the document in the input, from 0.
        document: usize,
        /// Index in `items` when the object is a list item.
        item: Option<usize>,
        /// Path of the field, such as `spec.rules[0].http.paths[1].backend`.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// An object could not be written (for example a timestamp outside years 0 to 9999).
    #[error("cannot write object {index}: {message}")]
    Write {
        /// Index of the object in the input slice.
        index: usize,
        /// What went wrong.
        message: String,
    },
}

fn fmt_item(item: Option<usize>) -> String {
    item.map(|i| format!(" items[{i}]")).unwrap_or_default()
}

/// Every `networking.k8s.io/v1` Ingress in a (multi-document) YAML string, in order; list
/// documents contribute their items; other kinds are skipped.
///
/// # Errors
///
/// [`ManifestError`] naming the document, and the field path for a bad field.
pub fn from_yaml_str(text: &str) -> Result<Vec<Ingress>, ManifestError> {
    objects_of_kind(yaml_documents(text)?)
}

/// Every Ingress in a JSON text holding one object (an Ingress, a list, or another kind,
/// which yields nothing).
///
/// # Errors
///
/// [`ManifestError`] naming the field path for a bad field.
pub fn from_json_str(text: &str) -> Result<Vec<Ingress>, ManifestError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ManifestError::Json(e.to_string()))?;
    objects_of_kind(vec![value])
}

/// Every `networking.k8s.io/v1` IngressClass in a (multi-document) YAML string.
///
/// # Errors
///
/// As [`from_yaml_str`].
pub fn ingress_classes_from_yaml_str(text: &str) -> Result<Vec<IngressClass>, ManifestError> {
    objects_of_kind(yaml_documents(text)?)
}

/// Writes Ingresses as multi-document YAML, each with `apiVersion` and `kind`, keys in
/// alphabetical order as `kubectl` prints them.
///
/// # Errors
///
/// [`ManifestError::Write`] when an object has a value JSON cannot express.
pub fn to_yaml_string(ingresses: &[Ingress]) -> Result<String, ManifestError> {
    let mut out = String::new();
    for (index, ingress) in ingresses.iter().enumerate() {
        let value = to_json_value(ingress).map_err(|message| ManifestError::Write {
            index,
            message: message.to_string(),
        })?;
        out.push_str("---\n");
        write_yaml_block(&mut out, &value, 0);
    }
    Ok(out)
}

/// Writes one Ingress as pretty JSON, with `apiVersion` and `kind`.
///
/// # Errors
///
/// [`ManifestError::Write`] when the object has a value JSON cannot express.
pub fn to_json_string(ingress: &Ingress) -> Result<String, ManifestError> {
    let write_error = |e: serde_json::Error| ManifestError::Write {
        index: 0,
        message: e.to_string(),
    };
    let value = to_json_value(ingress).map_err(write_error)?;
    serde_json::to_string_pretty(&value).map_err(write_error)
}

/// The Kubernetes JSON form of an object of a known kind, with `apiVersion` and `kind`.
///
/// # Errors
///
/// When the object has a value JSON cannot express (such as an out-of-range timestamp).
pub fn to_json_value<T: Kind + serde::Serialize>(object: &T) -> Result<Value, serde_json::Error> {
    let mut map = Map::new();
    map.insert("apiVersion".into(), Value::String(T::API_VERSION.into()));
    map.insert("kind".into(), Value::String(T::KIND.into()));
    if let Value::Object(fields) = serde_json::to_value(object)? {
        map.extend(fields);
    }
    Ok(Value::Object(map))
}

/// Nesting limit for YAML input, as serde_json has for JSON: Kubernetes objects are far
/// shallower, and deep input must not exhaust the stack.
const MAX_YAML_DEPTH: usize = 128;

// === YAML output ===
//
// A small block-style emitter for JSON values. Strings that could read back as anything but
// the same string (numbers, YAML 1.1 booleans, null, leading or trailing spaces, indicators)
// are written as JSON strings, which are valid YAML double-quoted scalars; only plain words
// such as names, hosts and paths are left unquoted.

/// Writes `value` as a block node whose lines are indented by `indent` spaces.
fn write_yaml_block(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            // Sorted here rather than trusting the map's order, which depends on whether some
            // crate in the build enables serde_json's `preserve_order`.
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            for (key, item) in entries {
                pad(out, indent);
                write_yaml_string(out, key);
                out.push(':');
                match item {
                    Value::Object(m) if !m.is_empty() => {
                        out.push('\n');
                        write_yaml_block(out, item, indent + 2);
                    }
                    // Sequences under a key sit at the key's indentation, as kubectl writes them.
                    Value::Array(a) if !a.is_empty() => {
                        out.push('\n');
                        write_yaml_block(out, item, indent);
                    }
                    scalar => {
                        out.push(' ');
                        write_yaml_scalar(out, scalar);
                        out.push('\n');
                    }
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                pad(out, indent);
                out.push('-');
                match item {
                    Value::Object(m) if !m.is_empty() => write_inline_block(out, item, indent + 2),
                    Value::Array(a) if !a.is_empty() => write_inline_block(out, item, indent + 2),
                    scalar => {
                        out.push(' ');
                        write_yaml_scalar(out, scalar);
                        out.push('\n');
                    }
                }
            }
        }
        scalar => {
            pad(out, indent);
            write_yaml_scalar(out, scalar);
            out.push('\n');
        }
    }
}

/// Writes a collection that starts on the line of a `-` indicator.
fn write_inline_block(out: &mut String, value: &Value, indent: usize) {
    let mut block = String::new();
    write_yaml_block(&mut block, value, indent);
    out.push(' ');
    out.push_str(block.get(indent..).unwrap_or(&block));
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn write_yaml_scalar(out: &mut String, value: &Value) {
    match value {
        Value::String(s) => write_yaml_string(out, s),
        Value::Object(_) => out.push_str("{}"),
        Value::Array(_) => out.push_str("[]"),
        // null, booleans and numbers print the same in JSON and YAML.
        other => out.push_str(&other.to_string()),
    }
}

fn write_yaml_string(out: &mut String, s: &str) {
    if is_plain_safe(s) {
        out.push_str(s);
    } else {
        // A JSON string is a valid YAML double-quoted scalar with the same value.
        out.push_str(&Value::String(s.to_owned()).to_string());
    }
}

/// True for strings that read back as the same string when written unquoted.
fn is_plain_safe(s: &str) -> bool {
    const WORDS: &[&str] = &[
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "nan", "inf",
    ];
    let bytes = s.as_bytes();
    let starts_well = bytes
        .first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'/');
    starts_well
        && bytes
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'/' | b'-'))
        && !WORDS.iter().any(|w| s.eq_ignore_ascii_case(w))
}

// Later serde-saphyr 0.0.x releases deprecate building `Options`/`Budget` with struct
// literals in favour of macros that 0.0.16 (the locked version) lacks; this form builds on both.
#[allow(deprecated)]
pub(crate) fn yaml_documents(text: &str) -> Result<Vec<Value>, ManifestError> {
    let options = serde_saphyr::Options {
        budget: Some(serde_saphyr::Budget {
            max_depth: MAX_YAML_DEPTH,
            ..serde_saphyr::Budget::default()
        }),
        ..serde_saphyr::Options::default()
    };
    serde_saphyr::from_multiple_with_options::<Value>(text, options)
        .map_err(|e| ManifestError::Yaml(e.to_string()))
}

/// Collects the objects of kind `T` from parsed documents, descending into lists.
fn objects_of_kind<T: Kind + DeserializeOwned>(
    documents: Vec<Value>,
) -> Result<Vec<T>, ManifestError> {
    let mut out = Vec::new();
    for_each_object(documents, &[T::KIND], |kind, object| {
        if kind == T::KIND {
            out.push(object.decode(&[T::API_VERSION])?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// One object of a manifest, not yet decoded: its fields and where it was found.
pub(crate) struct RawObject {
    map: Map<String, Value>,
    document: usize,
    item: Option<usize>,
}

impl RawObject {
    /// Decodes the object as `T` when its `apiVersion` is one of `versions`.
    pub(crate) fn decode<T: DeserializeOwned>(
        mut self,
        versions: &[&'static str],
    ) -> Result<T, ManifestError> {
        let api_version = self
            .map
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !versions.contains(&api_version) {
            let kind = self.map.get("kind").and_then(Value::as_str).unwrap_or("");
            return Err(ManifestError::UnsupportedVersion {
                document: self.document,
                item: self.item,
                kind: kind.to_owned(),
                api_version: api_version.to_owned(),
                supported: versions.first().copied().unwrap_or(""),
            });
        }
        self.map.remove("kind");
        self.map.remove("apiVersion");
        let mut value = Value::Object(self.map);
        drop_nulls(&mut value);
        serde_path_to_error::deserialize(value).map_err(|err| ManifestError::Field {
            document: self.document,
            item: self.item,
            path: err.path().to_string(),
            message: err.inner().to_string(),
        })
    }
}

/// Calls `visit` with the kind and fields of every object in `documents`, in order; the
/// items of a `List`, and of a list of one of the `listed` kinds (`IngressList`), count as
/// objects of their own. Documents that are `null` (an empty YAML document) are skipped.
pub(crate) fn for_each_object(
    documents: Vec<Value>,
    listed: &[&str],
    mut visit: impl FnMut(&str, RawObject) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    let mut visit_map = |map: Map<String, Value>, document, item| {
        let kind = map
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        visit(
            &kind,
            RawObject {
                map,
                document,
                item,
            },
        )
    };
    for (document, value) in documents.into_iter().enumerate() {
        if value.is_null() {
            continue;
        }
        let Value::Object(mut map) = value else {
            return Err(ManifestError::NotAnObject {
                document,
                item: None,
            });
        };
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
        let is_list = kind == "List"
            || kind
                .strip_suffix("List")
                .is_some_and(|k| listed.contains(&k));
        if !is_list {
            visit_map(map, document, None)?;
            continue;
        }
        let items = match map.remove("items") {
            Some(Value::Array(items)) => items,
            _ => Vec::new(),
        };
        for (index, item) in items.into_iter().enumerate() {
            let Value::Object(item_map) = item else {
                return Err(ManifestError::NotAnObject {
                    document,
                    item: Some(index),
                });
            };
            visit_map(item_map, document, Some(index))?;
        }
    }
    Ok(())
}

/// Removes `null` members of objects, since Kubernetes treats them as absent. The contents of
/// `fieldsV1` are opaque JSON and left alone.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            for (key, v) in map.iter_mut() {
                if key != "fieldsV1" {
                    drop_nulls(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_document_and_field() {
        let yaml = "kind: Service\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nspec:\n  rules:\n  - http:\n      paths:\n      - backend:\n          service:\n            port:\n              number: high\n";
        let err = from_yaml_str(yaml).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("document 1: spec.rules[0]"), "{text}");
        assert!(text.contains("port.number"), "{text}");
    }

    #[test]
    fn lists_and_other_kinds() {
        let json = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Service","metadata":{"name":"s"}},
            {"apiVersion":"networking.k8s.io/v1","kind":"Ingress","metadata":{"name":"a","creationTimestamp":null}}
        ]}"#;
        let got = from_json_str(json).unwrap();
        assert_eq!(got.len(), 1);
        let old = "apiVersion: extensions/v1beta1\nkind: Ingress\n";
        assert!(matches!(
            from_yaml_str(old),
            Err(ManifestError::UnsupportedVersion { document: 0, .. })
        ));
        assert!(matches!(
            from_yaml_str("- a\n- b\n"),
            Err(ManifestError::NotAnObject { document: 0, .. })
        ));
        assert!(from_yaml_str("").unwrap().is_empty());
        assert!(from_yaml_str("---\n---\n").unwrap().is_empty());
    }
}
