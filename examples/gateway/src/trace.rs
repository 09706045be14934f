//! W3C Trace Context (`traceparent`) for each request: taken from the client when it is
//! valid, started otherwise, and passed on with the gateway's own span as the parent.
//!
//! | client's `traceparent` | what the backend and the HBONE CONNECT get |
//! |---|---|
//! | valid (version `00`, or a later version whose first 55 characters read as `00`) | the same trace id and sampled flag, the gateway's span id as parent id, version `00` |
//! | absent | a new random trace id, the gateway's span id, flags `00` (the gateway exports no spans, so it does not claim a sampled trace) |
//! | invalid, or more than one | replaced as if absent; the client's `tracestate` is dropped with it (it belongs to the trace that was not taken) |

use std::fmt;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// The `traceparent` header.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The `tracestate` header.
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Length of a version-00 `traceparent`: `VV-TTTT(32)-PPPP(16)-FF`.
const LEN: usize = 55;

/// One request's trace context as the gateway continues it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceContext {
    /// The trace id (never zero).
    pub(crate) trace_id: u128,
    /// The gateway's span for this request (never zero): the parent id it sends on.
    pub(crate) span_id: u64,
    /// The client's span (its `traceparent`'s parent id); `None` when the gateway started
    /// the trace.
    pub(crate) parent_id: Option<u64>,
    /// Trace flags sent on: the client's sampled bit, or `00`.
    pub(crate) flags: u8,
}

/// What became of the client's `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Taken and continued.
    Taken,
    /// There was none: a trace was started.
    Started,
    /// It was invalid: replaced by a new trace.
    Replaced,
}

impl Origin {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Taken => "taken",
            Self::Started => "started",
            Self::Replaced => "replaced",
        }
    }
}

impl TraceContext {
    /// Continues the trace of `headers` (or starts one) and rewrites them for the backend:
    /// `traceparent` names the gateway's span; an invalid one is replaced and its
    /// `tracestate` removed.
    pub(crate) fn continue_from(headers: &mut HeaderMap) -> (Self, Origin) {
        let mut values = headers.get_all(TRACEPARENT).iter();
        let (first, second) = (values.next(), values.next());
        let (context, origin) = match (first, second) {
            (None, _) => (Self::start(), Origin::Started),
            (Some(value), None) => match parse(value.as_bytes()) {
                Some((trace_id, parent_id, flags)) => (
                    Self {
                        trace_id,
                        span_id: new_span_id(),
                        parent_id: Some(parent_id),
                        flags: flags & 0x01,
                    },
                    Origin::Taken,
                ),
                None => (Self::start(), Origin::Replaced),
            },
            (Some(_), Some(_)) => (Self::start(), Origin::Replaced),
        };
        if origin == Origin::Replaced {
            headers.remove(TRACESTATE);
        }
        headers.insert(TRACEPARENT, context.header_value());
        (context, origin)
    }

    /// A new trace whose root is the gateway's span.
    fn start() -> Self {
        Self {
            trace_id: fastrand::u128(1..),
            span_id: new_span_id(),
            parent_id: None,
            flags: 0,
        }
    }

    /// The `traceparent` the gateway sends on: version 00, this trace, the gateway's span.
    pub(crate) fn header_value(&self) -> HeaderValue {
        let mut buf = [0u8; LEN];
        buf[..3].copy_from_slice(b"00-");
        hex(&mut buf[3..35], self.trace_id);
        buf[35] = b'-';
        hex(&mut buf[36..52], u128::from(self.span_id));
        buf[52] = b'-';
        hex(&mut buf[53..55], u128::from(self.flags));
        HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The trace id as 32 lowercase hex digits, for logs.
    pub(crate) fn trace_hex(&self) -> Hex {
        Hex(self.trace_id, 32)
    }

    /// The gateway's span id as 16 lowercase hex digits, for logs.
    pub(crate) fn span_hex(&self) -> Hex {
        Hex(u128::from(self.span_id), 16)
    }
}

/// A number shown as `.1` lowercase hex digits, zero-padded; formats without allocating.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hex(u128, usize);

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:0width$x}", self.0, width = self.1)
    }
}

fn new_span_id() -> u64 {
    fastrand::u64(1..)
}

/// Writes `value`'s low `out.len() * 4` bits as lowercase hex.
fn hex(out: &mut [u8], value: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut v = value;
    for b in out.iter_mut().rev() {
        *b = DIGITS[(v & 0xf) as usize];
        v >>= 4;
    }
}

/// Parses a `traceparent` (W3C Trace Context, section 3.2): `(trace id, parent id, flags)`.
/// Version 00 must be exactly 55 characters; a later version (not `ff`) is read by its first
/// 55 characters, which must be followed by `-` if anything follows. Hex must be lowercase;
/// an all-zero trace id or parent id is invalid.
fn parse(value: &[u8]) -> Option<(u128, u64, u8)> {
    if value.len() < LEN {
        return None;
    }
    let version = u8::try_from(parse_hex(&value[0..2])?).ok()?;
    if version == 0xff || (version == 0 && value.len() != LEN) {
        return None;
    }
    if value.len() > LEN && value[LEN] != b'-' {
        return None;
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let trace_id = parse_hex(&value[3..35])?;
    let parent_id = u64::try_from(parse_hex(&value[36..52])?).ok()?;
    let flags = u8::try_from(parse_hex(&value[53..55])?).ok()?;
    if trace_id == 0 || parent_id == 0 {
        return None;
    }
    Some((trace_id, parent_id, flags))
}

/// Lowercase hex digits only (at most 32 of them).
fn parse_hex(digits: &[u8]) -> Option<u128> {
    digits.iter().try_fold(0u128, |acc, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        Some((acc << 4) | u128::from(v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_continued_with_a_new_span() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(VALID));
        headers.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
        let (ctx, origin) = TraceContext::continue_from(&mut headers);
        assert_eq!(origin, Origin::Taken);
        assert_eq!(ctx.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(ctx.parent_id, Some(0x00f067aa0ba902b7));
        assert_ne!(ctx.span_id, 0x00f067aa0ba902b7);
        let sent = headers[TRACEPARENT].to_str().unwrap().to_owned();
        assert_eq!(sent.len(), 55);
        assert!(
            sent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{sent}"
        );
        assert!(sent.ends_with("-01"), "{sent}");
        assert_eq!(&sent[36..52], ctx.span_hex().to_string());
        assert_eq!(headers[TRACESTATE], "vendor=x");
    }

    #[test]
    fn invalid_traceparents_are_replaced() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(TRACEPARENT, HeaderValue::from_str(bad).unwrap());
            headers.insert(TRACESTATE, HeaderValue::from_static("vendor=x"));
            let (ctx, origin) = TraceContext::continue_from(&mut headers);
            assert_eq!(origin, Origin::Replaced, "{bad:?}");
            assert_eq!(ctx.parent_id, None);
            assert_ne!(ctx.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
            assert!(!headers.contains_key(TRACESTATE), "{bad:?}");
            assert!(parse(headers[TRACEPARENT].as_bytes()).is_some());
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let v = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future";
        assert_eq!(
            parse(v.as_bytes()),
            Some((0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, 1))
        );
    }

    #[test]
    fn two_traceparents_are_invalid_and_none_starts_a_trace() {
        let mut headers = HeaderMap::new();
        headers.append(TRACEPARENT, HeaderValue::from_static(VALID));
        headers.append(TRACEPARENT, HeaderValue::from_static(VALID));
        assert_eq!(
            TraceContext::continue_from(&mut headers).1,
            Origin::Replaced
        );
        assert_eq!(headers.get_all(TRACEPARENT).iter().count(), 1);
        let mut headers = HeaderMap::new();
        let (ctx, origin) = TraceContext::continue_from(&mut headers);
        assert_eq!(origin, Origin::Started);
        assert_eq!(ctx.flags, 0);
        assert!(parse(headers[TRACEPARENT].as_bytes()).is_some());
    }
}
