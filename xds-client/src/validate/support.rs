//! What the generated checks and the load rules share: the [`Violation`] they return, the path
//! segments it is built from, and the predicates of protoc-gen-validate's well-known formats.

use std::borrow::Cow;
use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use envoy_types::pb::google::protobuf::Duration;
use foldhash::{HashSet as FastSet, HashSetExt};

/// Why a resource breaks a rule: the field (a path from the resource, such as
/// `filter_chains[0].filters[1].name`), the rule (such as `string.min_len`, or
/// `envoy.cluster.cluster_provided` for a rule Envoy applies when it loads the resource), and
/// what the rule asks.
///
/// `Display` writes `field: message [rule]`, which is what a NACK carries after the resource's
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Innermost segment first: each enclosing message pushes its own on the way out.
    path: Vec<Seg>,
    rule: &'static str,
    message: Cow<'static, str>,
}

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    /// A field, by its protobuf name.
    Field(&'static str),
    /// An item of a repeated field.
    Index(&'static str, usize),
    /// A value of a map field, by its key.
    Key(&'static str, String),
}

/// Longest map key quoted in a path; a longer one is cut (the path names a place, it does not
/// copy the input).
const MAX_KEY: usize = 64;

// === impl Violation ===

impl Violation {
    /// A violation at `seg` of the message being checked.
    #[cold]
    pub(crate) fn new(seg: Seg, rule: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        Self {
            path: vec![seg],
            rule,
            message: message.into(),
        }
    }

    /// The same violation seen from the enclosing message, where the checked message sits at
    /// `seg`.
    #[cold]
    pub(crate) fn at(mut self, seg: Seg) -> Self {
        self.path.push(seg);
        self
    }

    /// The field that breaks the rule, as a path from the resource:
    /// `virtual_hosts[1].domains[0]`, `metadata.filter_metadata["envoy.lb"]`.
    pub fn field(&self) -> String {
        let mut out = String::new();
        for (i, seg) in self.path.iter().rev().enumerate() {
            if i > 0 {
                out.push('.');
            }
            match seg {
                Seg::Field(name) => out.push_str(name),
                Seg::Index(name, idx) => {
                    out.push_str(name);
                    out.push_str(&format!("[{idx}]"));
                }
                Seg::Key(name, key) => {
                    out.push_str(name);
                    out.push_str(&format!("[{key:?}]"));
                }
            }
        }
        out
    }

    /// The rule: a protoc-gen-validate rule kind (`uint32.lte`, `oneof.required`), one of
    /// meshkit's two additions to them (`enum.defined`, `envoy.duration`), or a load rule of
    /// Envoy's (`envoy.<resource>.<rule>`). docs/xds.md lists them.
    pub fn rule(&self) -> &str {
        self.rule
    }

    /// What the rule asks, in words.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} [{}]", self.field(), self.message, self.rule)
    }
}

impl std::error::Error for Violation {}

// === predicates used by the generated code ===

/// A map key as a path shows it, cut to [`MAX_KEY`] characters.
pub(crate) fn key(k: &impl fmt::Display) -> String {
    let s = k.to_string();
    if s.chars().count() <= MAX_KEY {
        return s;
    }
    let mut cut: String = s.chars().take(MAX_KEY).collect();
    cut.push('…');
    cut
}

/// Length in characters (Unicode code points), as protoc-gen-validate counts `min_len`.
pub(crate) fn chars(s: &str) -> usize {
    s.chars().count()
}

/// A Duration as nanoseconds, for comparisons with the bounds of a rule.
pub(crate) fn nanos(d: &Duration) -> i128 {
    i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos)
}

/// Largest `seconds` of a protobuf Duration (10,000 years).
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

/// Envoy's check of every Duration in a resource (MessageUtil::validateDurationFields):
/// non-negative, nanoseconds below one second, and within protobuf's range.
pub(crate) fn duration_in_range(d: &Duration) -> Result<(), &'static str> {
    if d.seconds < 0 || d.nanos < 0 {
        return Err("must not be negative");
    }
    if d.nanos > 999_999_999 || d.seconds > MAX_DURATION_SECONDS {
        return Err("is out of range (at most 315576000000 s and 999999999 ns)");
    }
    Ok(())
}

/// Whether every item differs from the others (`repeated.unique`).
pub(crate) fn unique<T: Eq + Hash>(items: &[T]) -> bool {
    if items.len() < 2 {
        return true;
    }
    if items.len() <= 8 {
        return items
            .iter()
            .enumerate()
            .all(|(i, a)| items[i + 1..].iter().all(|b| a != b));
    }
    let mut seen = FastSet::with_capacity(items.len());
    items.iter().all(|x| seen.insert(x))
}

/// protoc-gen-validate's `hostname`: at most 253 bytes once a trailing dot is dropped, labels
/// of 1 to 63 letters, digits and hyphens that neither start nor end with a hyphen.
#[allow(
    dead_code,
    reason = "the generator calls it for this format; no annotation in the current protos uses it"
)]
pub(crate) fn hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.len() > 253 {
        return false;
    }
    s.split('.').all(|label| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
            && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
    })
}

/// protoc-gen-validate's `ip`.
#[allow(
    dead_code,
    reason = "the generator calls it for this format; no annotation in the current protos uses it"
)]
pub(crate) fn ip(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok()
}

/// protoc-gen-validate's `ipv4`.
#[allow(
    dead_code,
    reason = "the generator calls it for this format; no annotation in the current protos uses it"
)]
pub(crate) fn ipv4(s: &str) -> bool {
    s.parse::<Ipv4Addr>().is_ok()
}

/// protoc-gen-validate's `ipv6`.
#[allow(
    dead_code,
    reason = "the generator calls it for this format; no annotation in the current protos uses it"
)]
pub(crate) fn ipv6(s: &str) -> bool {
    s.parse::<Ipv6Addr>().is_ok()
}

/// protoc-gen-validate's `address`: a hostname or an IP address.
#[allow(
    dead_code,
    reason = "the generator calls it for this format; no annotation in the current protos uses it"
)]
pub(crate) fn address(s: &str) -> bool {
    ip(s) || hostname(s)
}

/// protoc-gen-validate's `uuid`: 8-4-4-4-12 hexadecimal digits.
#[allow(
    dead_code,
    reason = "the generator calls it for this format; no annotation in the current protos uses it"
)]
pub(crate) fn uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// `HTTP_HEADER_NAME`. Strict, protoc-gen-validate's `^:?[0-9a-zA-Z!#$%&'*+-.^_|~\x60]+$`:
/// an optional leading `:`, then one or more of those characters (the class's `+-.` is a range,
/// so `,` is in it too). Loose: no NUL, CR or LF.
pub(crate) fn header_name(s: &str, strict: bool) -> bool {
    if !strict {
        return loose_header(s);
    }
    let s = s.strip_prefix(':').unwrap_or(s);
    !s.is_empty()
        && s.bytes().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+'
                        ..=b'.' | b'^' | b'_' | b'|' | b'~' | b'`'
                )
        })
}

/// `HTTP_HEADER_VALUE`. Strict, `^[^\u0000-\u0008\u000A-\u001F\u007F]*$`: no control character
/// but horizontal tab. Loose: no NUL, CR or LF.
pub(crate) fn header_value(s: &str, strict: bool) -> bool {
    if !strict {
        return loose_header(s);
    }
    !s.bytes()
        .any(|c| matches!(c, 0x00..=0x08 | 0x0A..=0x1F | 0x7F))
}

/// protoc-gen-validate's loose header rule, `^[^\u0000\u000A\u000D]*$`.
fn loose_header(s: &str) -> bool {
    !s.bytes().any(|c| matches!(c, 0x00 | 0x0A | 0x0D))
}

/// `RouteMatch.path_separated_prefix`'s pattern `^[^?#]+[^?#/]$`: two or more characters, no
/// `?` or `#`, not ending with `/`.
pub(crate) fn path_separated_prefix(s: &str) -> bool {
    s.chars().count() >= 2 && !s.contains(['?', '#']) && !s.ends_with('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_as_protoc_gen_validate_defines_them() {
        for ok in [
            "a",
            "example.com",
            "example.com.",
            "a-b.c1",
            &"a".repeat(63),
        ] {
            assert!(hostname(ok), "{ok}");
        }
        let long = format!("{}.com", ["a"; 126].join("."));
        for bad in [
            "",
            ".",
            "a..b",
            "-a",
            "a-",
            "a_b",
            "é.com",
            &"a".repeat(64),
            &long,
        ] {
            assert!(!hostname(bad), "{bad}");
        }
        assert!(address("10.0.0.1") && address("::1") && address("svc.ns") && !address("a b"));
        assert!(ip("::1") && ipv4("1.2.3.4") && !ipv4("::1") && ipv6("::1") && !ipv6("1.2.3.4"));
        assert!(uuid("123e4567-e89b-12d3-a456-426614174000"));
        assert!(
            !uuid("123e4567e89b12d3a456426614174000")
                && !uuid("123e4567-e89b-12d3-a456-42661417400g")
        );
    }

    #[test]
    fn header_names_and_values_strict_and_loose() {
        for ok in ["x-a", ":path", "a,b", "A1!#$%&'*+-.^_|~`"] {
            assert!(header_name(ok, true), "{ok}");
        }
        for bad in ["", ":", "a b", "a:b", "a/b", "a\"b", "é"] {
            assert!(!header_name(bad, true), "{bad}");
        }
        assert!(header_name("a b", false) && !header_name("a\nb", false) && header_name("", false));
        assert!(header_value("", true) && header_value("a\tb é", true));
        for bad in ["a\nb", "a\rb", "a\0b", "a\x7fb", "a\x01b"] {
            assert!(!header_value(bad, true), "{bad:?}");
        }
        assert!(header_value("a\x01b", false) && !header_value("a\rb", false));
    }

    #[test]
    fn durations_envoy_accepts() {
        let d = |seconds, nanos| Duration { seconds, nanos };
        assert!(duration_in_range(&d(0, 0)).is_ok());
        assert!(duration_in_range(&d(MAX_DURATION_SECONDS, 999_999_999)).is_ok());
        for bad in [
            d(-1, 0),
            d(0, -1),
            d(0, 1_000_000_000),
            d(MAX_DURATION_SECONDS + 1, 0),
        ] {
            assert!(duration_in_range(&bad).is_err(), "{bad:?}");
        }
        assert_eq!(nanos(&d(2, 5)), 2_000_000_005);
    }

    #[test]
    fn patterns_keys_and_uniqueness() {
        assert!(path_separated_prefix("/a") && path_separated_prefix("/api/v1"));
        for bad in ["/", "a", "/a/", "/a?b", "/a#"] {
            assert!(!path_separated_prefix(bad), "{bad}");
        }
        assert!(unique::<u32>(&[]) && unique(&[1, 2, 3]) && !unique(&[1, 2, 1]));
        let many: Vec<u32> = (0..20).collect();
        assert!(unique(&many));
        let mut dup = many.clone();
        dup.push(7);
        assert!(!unique(&dup));
        assert_eq!(key(&"k"), "k");
        assert_eq!(key(&"x".repeat(100)).chars().count(), MAX_KEY + 1);
    }

    #[test]
    fn paths_read_from_the_resource_down() {
        let v = Violation::new(Seg::Field("name"), "string.min_len", "must not be empty")
            .at(Seg::Index("filters", 1))
            .at(Seg::Index("filter_chains", 0));
        assert_eq!(v.field(), "filter_chains[0].filters[1].name");
        let v = Violation::new(Seg::Key("filter_metadata", "k".into()), "r", "m")
            .at(Seg::Field("metadata"));
        assert_eq!(v.field(), "metadata.filter_metadata[\"k\"]");
        assert_eq!(v.to_string(), "metadata.filter_metadata[\"k\"]: m [r]");
    }
}
