//! The Kubernetes protobuf encoding: the magic `k8s\0` followed by a `runtime.Unknown` whose
//! `typeMeta` names the kind and whose `raw` holds the object.
//!
//! This is what an API server sends for `Accept: application/vnd.kubernetes.protobuf`.
//!
//! ```
//! use meshkit_ingress_model::Ingress;
//! use meshkit_ingress_model::envelope::{self, EnvelopeError};
//!
//! let bytes = envelope::encode(&Ingress::default());
//! assert!(bytes.starts_with(b"k8s\0"));
//! let back: Ingress = envelope::decode(&bytes)?;
//! assert_eq!(back, Ingress::default());
//! assert!(matches!(envelope::decode::<Ingress>(b"{}"), Err(EnvelopeError::WrongMagic)));
//! # Ok::<(), EnvelopeError>(())
//! ```

use prost::Message;

use crate::k8s::io::api::networking::v1::{Ingress, IngressClass, IngressClassList, IngressList};
use crate::k8s::io::apimachinery::pkg::runtime::{TypeMeta, Unknown};

/// The four bytes that start every Kubernetes protobuf message.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// A generated message that is a top-level Kubernetes kind.
pub trait Kind: Message + Default {
    /// API version, such as `networking.k8s.io/v1`.
    const API_VERSION: &'static str;
    /// Kind, such as `Ingress`.
    const KIND: &'static str;
}

/// Why bytes could not be decoded as a Kubernetes protobuf object.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The bytes do not start with `k8s\0`.
    #[error("not a Kubernetes protobuf message: missing the k8s\\0 prefix")]
    WrongMagic,
    /// The bytes end in the middle of the envelope or of the object.
    #[error("truncated Kubernetes protobuf message")]
    Truncated,
    /// The envelope holds another kind than the one asked for.
    #[error("expected {expected_api_version} {expected_kind}, found {api_version:?} {kind:?}")]
    WrongKind {
        /// API version asked for.
        expected_api_version: &'static str,
        /// Kind asked for.
        expected_kind: &'static str,
        /// API version in the envelope.
        api_version: String,
        /// Kind in the envelope.
        kind: String,
    },
    /// `contentEncoding` is set; no encoding (such as gzip) is supported.
    #[error("unsupported content encoding {0:?}")]
    UnsupportedEncoding(String),
    /// The envelope or the object is not valid protobuf for its type.
    #[error("malformed protobuf")]
    Malformed(#[from] prost::DecodeError),
}

impl Kind for Ingress {
    const API_VERSION: &'static str = "networking.k8s.io/v1";
    const KIND: &'static str = "Ingress";
}

impl Kind for IngressList {
    const API_VERSION: &'static str = "networking.k8s.io/v1";
    const KIND: &'static str = "IngressList";
}

impl Kind for IngressClass {
    const API_VERSION: &'static str = "networking.k8s.io/v1";
    const KIND: &'static str = "IngressClass";
}

impl Kind for IngressClassList {
    const API_VERSION: &'static str = "networking.k8s.io/v1";
    const KIND: &'static str = "IngressClassList";
}

/// Encodes `object` as `k8s\0` + `runtime.Unknown`.
pub fn encode<T: Kind>(object: &T) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(T::API_VERSION.to_owned()),
            kind: Some(T::KIND.to_owned()),
        }),
        raw: Some(object.encode_to_vec()),
        content_encoding: None,
        content_type: None,
    };
    let mut out = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    out.extend_from_slice(MAGIC);
    unknown.encode(&mut out).unwrap_or_default();
    out
}

/// Decodes the envelope only, without checking the kind.
///
/// # Errors
///
/// [`EnvelopeError::WrongMagic`], [`EnvelopeError::Truncated`] or
/// [`EnvelopeError::Malformed`].
pub fn decode_unknown(bytes: &[u8]) -> Result<Unknown, EnvelopeError> {
    let Some(body) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return Err(if MAGIC.starts_with(bytes) {
            EnvelopeError::Truncated
        } else {
            EnvelopeError::WrongMagic
        });
    };
    decode_message(body)
}

/// Decodes a `T` from `k8s\0` + `runtime.Unknown`, checking the API version and kind.
///
/// # Errors
///
/// Any [`EnvelopeError`]: wrong magic, truncated input, another kind, an unsupported content
/// encoding, or malformed protobuf.
pub fn decode<T: Kind>(bytes: &[u8]) -> Result<T, EnvelopeError> {
    let unknown = decode_unknown(bytes)?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    if api_version != T::API_VERSION || kind != T::KIND {
        return Err(EnvelopeError::WrongKind {
            expected_api_version: T::API_VERSION,
            expected_kind: T::KIND,
            api_version,
            kind,
        });
    }
    match unknown.content_encoding.as_deref() {
        None | Some("") => {}
        Some(other) => return Err(EnvelopeError::UnsupportedEncoding(other.to_owned())),
    }
    decode_message(unknown.raw.as_deref().unwrap_or_default())
}

/// Decodes a message, reporting input that ends inside a top-level field as truncation
/// rather than as malformed.
fn decode_message<T: Message + Default>(bytes: &[u8]) -> Result<T, EnvelopeError> {
    T::decode(bytes).map_err(|err| {
        if ends_inside_field(bytes) {
            EnvelopeError::Truncated
        } else {
            EnvelopeError::Malformed(err)
        }
    })
}

/// Walks the top-level fields of a protobuf message and tells whether the input stops in
/// the middle of one (a key, a varint, a fixed-width value or a length-delimited payload).
fn ends_inside_field(mut buf: &[u8]) -> bool {
    fn varint(buf: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in 0..10 {
            let (&byte, rest) = buf.split_first()?;
            *buf = rest;
            value |= u64::from(byte & 0x7f) << (7 * shift);
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        // Over-long varint: malformed, not truncated. Report it as "not truncated".
        Some(0)
    }
    fn skip(buf: &mut &[u8], n: u64) -> Option<()> {
        let n = usize::try_from(n).ok()?;
        *buf = buf.get(n..)?;
        Some(())
    }
    while !buf.is_empty() {
        let Some(key) = varint(&mut buf) else {
            return true;
        };
        let step = match key & 0x7 {
            0 => varint(&mut buf).map(|_| ()),
            1 => skip(&mut buf, 8),
            2 => varint(&mut buf).and_then(|len| skip(&mut buf, len)),
            5 => skip(&mut buf, 4),
            // Groups and invalid wire types: malformed, not truncated.
            _ => return false,
        };
        if step.is_none() {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn sample() -> Ingress {
        Ingress {
            metadata: Some(ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip() {
        let bytes = encode(&sample());
        assert_eq!(&bytes[..4], MAGIC);
        let back: Ingress = decode(&bytes).unwrap();
        assert_eq!(back, sample());
        let list = IngressList {
            metadata: None,
            items: vec![sample(), sample()],
        };
        let back: IngressList = decode(&encode(&list)).unwrap();
        assert_eq!(back, list);
    }

    #[test]
    fn errors() {
        assert!(matches!(
            decode::<Ingress>(b""),
            Err(EnvelopeError::Truncated)
        ));
        assert!(matches!(
            decode::<Ingress>(b"k8"),
            Err(EnvelopeError::Truncated)
        ));
        assert!(matches!(
            decode::<Ingress>(b"k9s\0"),
            Err(EnvelopeError::WrongMagic)
        ));
        assert!(matches!(
            decode::<Ingress>(b"{\"kind\":1}"),
            Err(EnvelopeError::WrongMagic)
        ));
        let bytes = encode(&sample());
        for cut in 5..bytes.len() {
            // A cut between two fields leaves a shorter valid message, which protobuf cannot
            // tell apart; every other cut must be reported as truncation.
            match decode::<Ingress>(&bytes[..cut]) {
                Ok(_) | Err(EnvelopeError::Truncated | EnvelopeError::WrongKind { .. }) => {}
                Err(other) => panic!("cut at {cut}: {other}"),
            }
        }
        let list_bytes = encode(&IngressList::default());
        match decode::<Ingress>(&list_bytes) {
            Err(EnvelopeError::WrongKind { kind, .. }) => assert_eq!(kind, "IngressList"),
            other => panic!("unexpected {other:?}"),
        }
        let mut unknown = decode_unknown(&bytes).unwrap();
        unknown.content_encoding = Some("gzip".into());
        let mut encoded = MAGIC.to_vec();
        encoded.extend(unknown.encode_to_vec());
        assert!(matches!(
            decode::<Ingress>(&encoded),
            Err(EnvelopeError::UnsupportedEncoding(e)) if e == "gzip"
        ));
    }

    #[test]
    fn malformed_says_this_level_and_keeps_the_cause_as_source() {
        // Field 1 with wire type 7, which does not exist.
        let err = decode_unknown(b"k8s\0\x0f").unwrap_err();
        assert!(matches!(err, EnvelopeError::Malformed(_)), "{err:?}");
        assert_eq!(err.to_string(), "malformed protobuf");
        let source = std::error::Error::source(&err).expect("the prost error is the source");
        assert!(source.downcast_ref::<prost::DecodeError>().is_some());
    }
}
