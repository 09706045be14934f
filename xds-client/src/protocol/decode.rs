//! Step one (decode) and step two (validate) of the resources of a response, duplicate names,
//! and the NACK's error detail.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::Resource as WrappedResource;
use envoy_types::pb::google::protobuf::{Any as ProtoAny, Duration as ProtoDuration};
use envoy_types::pb::google::rpc::Status;
use foldhash::{HashSet as FastSet, HashSetExt};
use prost::Message;

use crate::resource::{AnyResource, RESOURCE_WRAPPER_TYPE_URL, ResourceType};

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// A rejected resource: its name when known, and why.
pub(super) type Rejection = (Option<String>, String);

/// The longest NACK error detail; the rejections past it are counted, not listed, so a NACK
/// of many resources stays small enough for any server to read.
const MAX_ERROR_DETAIL: usize = 16 * 1024;

/// One resource of a response after step one (decode) and step two (validate).
pub(super) struct Checked {
    pub(super) name: String,
    /// The value, the hash of its encoding, and its encoded size; `None` for a heartbeat.
    pub(super) body: Option<(AnyResource, u64, usize)>,
    pub(super) version: String,
    pub(super) ttl: Option<Duration>,
}

/// Step one and two for one SotW `Any`, possibly wrapped in a discovery `Resource` (TTL).
pub(super) fn check_sotw_any(
    kind: &ResourceType,
    any: &ProtoAny,
    version: &str,
) -> Result<Checked, Rejection> {
    if any.type_url != RESOURCE_WRAPPER_TYPE_URL {
        return check_any(kind, any, None, version.to_owned(), None);
    }
    let wrapped = WrappedResource::decode(any.value.as_slice())
        .map_err(|e| (None, format!("decode error: {e}")))?;
    check_wrapped(kind, wrapped, Some(version))
}

/// A Delta resource, or a SotW wrapper (then `version` is the response's).
pub(super) fn check_wrapped(
    kind: &ResourceType,
    r: WrappedResource,
    version: Option<&str>,
) -> Result<Checked, Rejection> {
    let name = if r.name.is_empty() {
        r.resource_name.map(|n| n.name).unwrap_or_default()
    } else {
        r.name
    };
    let ttl = r.ttl.as_ref().and_then(to_duration);
    let version = version.map_or(r.version, str::to_owned);
    match r.resource {
        None if name.is_empty() => Err((None, "heartbeat without a name".to_owned())),
        None => Ok(Checked {
            name,
            body: None,
            version,
            ttl,
        }),
        Some(any) => {
            let hint = (!name.is_empty()).then_some(name);
            check_any(kind, &any, hint, version, ttl)
        }
    }
}

pub(super) fn check_any(
    kind: &ResourceType,
    any: &ProtoAny,
    hint: Option<String>,
    version: String,
    ttl: Option<Duration>,
) -> Result<Checked, Rejection> {
    if any.type_url != kind.type_url() {
        return Err((
            hint,
            format!(
                "type_url {:?} does not match the response's {:?}",
                any.type_url,
                kind.type_url()
            ),
        ));
    }
    let (name, value) = kind
        .decode(&any.value)
        .map_err(|e| (hint.clone(), e.to_string()))?;
    if let Some(h) = hint
        && h != name
    {
        return Err((
            Some(h),
            format!("resource decodes with another name {name:?}"),
        ));
    }
    if name.is_empty() {
        return Err((None, "resource has an empty name".to_owned()));
    }
    if let Err(e) = kind.validate(&value) {
        return Err((Some(name), e.to_string()));
    }
    // Change detection only; a fixed seed keeps it stable across sessions.
    let mut h = foldhash::quality::FixedState::with_seed(0x6d65_7368_6b69_7421).build_hasher();
    h.write(&any.value);
    Ok(Checked {
        name,
        body: Some((value, h.finish(), any.value.len())),
        version,
        ttl,
    })
}

/// Rule: a name may appear once per response. Every copy of a repeated name is rejected.
pub(super) fn reject_duplicates(
    checked: &mut Vec<Checked>,
    errors: &mut Vec<Rejection>,
    removed: &[String],
) -> FastSet<String> {
    let mut seen: FastSet<&str> = FastSet::with_capacity(checked.len() + removed.len());
    let mut dups: FastSet<String> = FastSet::new();
    let names = checked
        .iter()
        .map(|c| c.name.as_str())
        .chain(errors.iter().filter_map(|(n, _)| n.as_deref()))
        .chain(removed.iter().map(String::as_str));
    for n in names {
        if !seen.insert(n) {
            dups.insert(n.to_owned());
        }
    }
    if !dups.is_empty() {
        checked.retain(|c| !dups.contains(&c.name));
        errors.retain(|(n, _)| n.as_ref().is_none_or(|n| !dups.contains(n)));
        let mut sorted: Vec<&String> = dups.iter().collect();
        sorted.sort();
        for n in sorted {
            errors.push((
                Some(n.clone()),
                "name appears more than once in the response".to_owned(),
            ));
        }
    }
    dups
}

/// What a cached resource counts against the cache limit: its encoding, its name and its
/// version.
pub(super) fn encoded_size(encoded: usize, name: &str, version: &str) -> usize {
    encoded
        .saturating_add(name.len())
        .saturating_add(version.len())
}

/// The NACK's `error_detail` message: each rejected resource and why, in response order, up
/// to [`MAX_ERROR_DETAIL`] bytes, then how many more were rejected.
pub(super) fn summarize(errors: &[Rejection]) -> Option<String> {
    if errors.is_empty() {
        return None;
    }
    let mut out = String::new();
    for (i, (n, why)) in errors.iter().enumerate() {
        let part = match n {
            Some(n) => format!("{n}: {why}"),
            None => why.clone(),
        };
        if out.len() + part.len() + 2 > MAX_ERROR_DETAIL {
            if out.is_empty() {
                // A single huge name or reason: keep its start.
                let mut end = MAX_ERROR_DETAIL / 2;
                while !part.is_char_boundary(end) {
                    end -= 1;
                }
                out.push_str(&part[..end]);
                out.push('…');
                if i + 1 == errors.len() {
                    return Some(out);
                }
                out.push_str(&format!("; and {} more rejected", errors.len() - i - 1));
            } else {
                out.push_str(&format!("; and {} more rejected", errors.len() - i));
            }
            return Some(out);
        }
        if !out.is_empty() {
            out.push_str("; ");
        }
        out.push_str(&part);
    }
    Some(out)
}

pub(super) fn nack_status(message: String) -> Status {
    Status {
        code: INVALID_ARGUMENT,
        message,
        details: Vec::new(),
    }
}

pub(super) fn to_duration(d: &ProtoDuration) -> Option<Duration> {
    if d.seconds < 0 || d.nanos < 0 || (d.seconds == 0 && d.nanos == 0) {
        return None;
    }
    let secs = u64::try_from(d.seconds).ok()?;
    let nanos = u64::try_from(d.nanos).ok()?;
    Duration::from_secs(secs).checked_add(Duration::from_nanos(nanos))
}
