//! Hand-written JSON forms of the generated types whose Kubernetes JSON shape differs from
//! their protobuf shape, plus the helper the derived impls use to omit empty fields.

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{self, Serializer};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::k8s::io::api::networking::v1::{HttpIngressRuleValue, IngressRule, IngressRuleValue};
use crate::k8s::io::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
use crate::k8s::io::apimachinery::pkg::runtime::RawExtension;
use crate::k8s::io::apimachinery::pkg::util::intstr::IntOrString;

/// True when `value` equals its default: `None`, an empty list or map, and so on. Kubernetes
/// omits such fields when writing JSON.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

// === impl Time ===

impl Time {
    /// Parses an RFC 3339 timestamp such as `2024-05-01T12:00:00Z`.
    ///
    /// # Errors
    ///
    /// Returns the parser's message when `text` is not RFC 3339.
    pub fn parse_rfc3339(text: &str) -> Result<Self, String> {
        let parsed = OffsetDateTime::parse(text, &Rfc3339).map_err(|e| e.to_string())?;
        Ok(Time {
            seconds: Some(parsed.unix_timestamp()),
            // Always within 0..1_000_000_000, so the cast cannot truncate.
            nanos: Some(parsed.nanosecond() as i32),
        })
    }

    /// Formats as RFC 3339 in UTC; fractional seconds only when `nanos` is not zero.
    ///
    /// # Errors
    ///
    /// Returns a message when the instant is outside the years 0000 to 9999 or `nanos` is
    /// outside `0..1_000_000_000`.
    pub fn to_rfc3339(&self) -> Result<String, String> {
        let seconds = self.seconds.unwrap_or(0);
        let nanos = self.nanos.unwrap_or(0);
        let nanos = u32::try_from(nanos)
            .ok()
            .filter(|n| *n < 1_000_000_000)
            .ok_or_else(|| format!("nanos {nanos} out of range"))?;
        let instant = OffsetDateTime::from_unix_timestamp(seconds)
            .map_err(|e| e.to_string())?
            .replace_nanosecond(nanos)
            .map_err(|e| e.to_string())?;
        instant.format(&Rfc3339).map_err(|e| e.to_string())
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = self.to_rfc3339().map_err(ser::Error::custom)?;
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Time {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TimeVisitor;
        impl Visitor<'_> for TimeVisitor {
            type Value = Time;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an RFC 3339 timestamp")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Time, E> {
                Time::parse_rfc3339(v)
                    .map_err(|msg| E::custom(format_args!("invalid timestamp {v:?}: {msg}")))
            }
        }
        deserializer.deserialize_str(TimeVisitor)
    }
}

// === impl IntOrString ===

impl IntOrString {
    /// An integer value.
    pub fn from_int(value: i32) -> Self {
        IntOrString {
            r#type: Some(0),
            int_val: Some(value),
            str_val: None,
        }
    }

    /// A string value.
    pub fn from_string(value: impl Into<String>) -> Self {
        IntOrString {
            r#type: Some(1),
            int_val: None,
            str_val: Some(value.into()),
        }
    }

    /// True when this holds a string (`type` 1).
    pub fn is_string(&self) -> bool {
        self.r#type == Some(1)
    }
}

impl Serialize for IntOrString {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.is_string() {
            serializer.serialize_str(self.str_val.as_deref().unwrap_or_default())
        } else {
            serializer.serialize_i32(self.int_val.unwrap_or_default())
        }
    }
}

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IntOrStringVisitor;
        impl Visitor<'_> for IntOrStringVisitor {
            type Value = IntOrString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a 32-bit integer or a string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IntOrString, E> {
                i32::try_from(v)
                    .map(IntOrString::from_int)
                    .map_err(|_| E::custom(format_args!("integer {v} out of 32-bit range")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IntOrString, E> {
                i32::try_from(v)
                    .map(IntOrString::from_int)
                    .map_err(|_| E::custom(format_args!("integer {v} out of 32-bit range")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IntOrString, E> {
                Ok(IntOrString::from_string(v))
            }
        }
        deserializer.deserialize_any(IntOrStringVisitor)
    }
}

// === impl FieldsV1, RawExtension ===

/// Writes raw JSON bytes as the JSON value they hold; empty bytes are `null`.
fn serialize_raw_json<S: Serializer>(raw: Option<&[u8]>, serializer: S) -> Result<S::Ok, S::Error> {
    match raw {
        None | Some([]) => serializer.serialize_none(),
        Some(bytes) => {
            let value: serde_json::Value = serde_json::from_slice(bytes)
                .map_err(|e| ser::Error::custom(format_args!("raw bytes are not JSON: {e}")))?;
            value.serialize(serializer)
        }
    }
}

/// Reads any JSON value and keeps its compact encoding as raw bytes.
fn deserialize_raw_json<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    serde_json::to_vec(&value).map_err(de::Error::custom)
}

impl Serialize for FieldsV1 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_raw_json(self.raw.as_deref(), serializer)
    }
}

impl<'de> Deserialize<'de> for FieldsV1 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(FieldsV1 {
            raw: Some(deserialize_raw_json(deserializer)?),
        })
    }
}

impl Serialize for RawExtension {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_raw_json(self.raw.as_deref(), serializer)
    }
}

impl<'de> Deserialize<'de> for RawExtension {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(RawExtension {
            raw: Some(deserialize_raw_json(deserializer)?),
        })
    }
}

// === impl IngressRule ===

/// The JSON shape of `IngressRule`: Go embeds `IngressRuleValue`, so `http` is a direct field.
#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct IngressRuleJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http: Option<HttpIngressRuleValue>,
}

impl Serialize for IngressRule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        IngressRuleJson {
            host: self.host.clone(),
            http: self
                .ingress_rule_value
                .as_ref()
                .and_then(|v| v.http.clone()),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for IngressRule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let json = IngressRuleJson::deserialize(deserializer)?;
        Ok(IngressRule {
            host: json.host,
            // An absent `http` is an absent rule value, as the Go decoder produces.
            ingress_rule_value: json.http.map(|http| IngressRuleValue { http: Some(http) }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_round_trips_rfc3339() {
        let t = Time::parse_rfc3339("2024-05-01T12:00:00Z").unwrap();
        assert_eq!(t.seconds, Some(1_714_564_800));
        assert_eq!(t.to_rfc3339().unwrap(), "2024-05-01T12:00:00Z");
        let offset = Time::parse_rfc3339("2024-05-01T14:00:00+02:00").unwrap();
        assert_eq!(offset, t);
        assert!(Time::parse_rfc3339("yesterday").is_err());
        let bad = Time {
            seconds: Some(i64::MAX),
            nanos: Some(0),
        };
        assert!(bad.to_rfc3339().is_err());
    }

    #[test]
    fn int_or_string_json_forms() {
        let n: IntOrString = serde_json::from_str("8080").unwrap();
        assert_eq!(n, IntOrString::from_int(8080));
        let s: IntOrString = serde_json::from_str("\"http\"").unwrap();
        assert_eq!(s, IntOrString::from_string("http"));
        assert_eq!(serde_json::to_string(&n).unwrap(), "8080");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"http\"");
        assert!(serde_json::from_str::<IntOrString>("4294967296").is_err());
        assert!(serde_json::from_str::<IntOrString>("true").is_err());
    }

    #[test]
    fn fields_v1_embeds_json() {
        let f: FieldsV1 = serde_json::from_str(r#"{"f:spec":{}}"#).unwrap();
        assert_eq!(f.raw.as_deref(), Some(br#"{"f:spec":{}}"#.as_slice()));
        assert_eq!(serde_json::to_string(&f).unwrap(), r#"{"f:spec":{}}"#);
    }
}
