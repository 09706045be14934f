//! SPIFFE IDs and trust domains, parsed strictly by the SPIFFE-ID standard.
//!
//! Nothing is normalised: an ID that is not already in canonical form (uppercase scheme or
//! trust domain, a `.` segment, a trailing slash, percent-encoding, a port) is rejected with an
//! error that says what is wrong, because two spellings of one identity would let an
//! authorization rule be bypassed.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

const SCHEME: &str = "spiffe://";

/// Longest SPIFFE ID accepted, in bytes (the URI SAN limit the standard asks to support).
pub const MAX_ID_LEN: usize = 2048;

/// Longest trust domain name accepted, in bytes.
pub const MAX_TRUST_DOMAIN_LEN: usize = 255;

/// What is wrong with a string that is not a SPIFFE ID or trust domain name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpiffeIdError {
    /// The input is the empty string.
    #[error("SPIFFE ID is empty")]
    Empty,
    /// The input does not start with the lowercase scheme `spiffe://`.
    #[error("SPIFFE ID must start with the scheme \"spiffe://\" in lowercase")]
    WrongScheme,
    /// Nothing stands between the scheme and the path.
    #[error("SPIFFE ID has no trust domain")]
    MissingTrustDomain,
    /// The trust domain holds a character other than `a-z`, `0-9`, `.`, `-` or `_` (this covers
    /// uppercase letters, ports, userinfo and percent-encoding).
    #[error(
        "trust domain contains {found:?} at byte {index}; only a-z, 0-9, '.', '-' and '_' are allowed"
    )]
    BadTrustDomainChar {
        /// The offending character.
        found: char,
        /// Its byte offset within the trust domain name.
        index: usize,
    },
    /// The trust domain is longer than [`MAX_TRUST_DOMAIN_LEN`] bytes.
    #[error("trust domain is {len} bytes long; at most {MAX_TRUST_DOMAIN_LEN} are allowed")]
    TrustDomainTooLong {
        /// Length of the trust domain in bytes.
        len: usize,
    },
    /// A path segment holds a character other than `a-z`, `A-Z`, `0-9`, `.`, `-` or `_` (this
    /// covers query strings, fragments and percent-encoding).
    #[error(
        "path contains {found:?} at byte {index}; only letters, digits, '.', '-' and '_' are allowed"
    )]
    BadPathChar {
        /// The offending character.
        found: char,
        /// Its byte offset within the path.
        index: usize,
    },
    /// The path holds an empty segment (`//`).
    #[error("path contains an empty segment")]
    EmptySegment,
    /// The path holds a `.` or `..` segment.
    #[error("path contains a '.' or '..' segment")]
    DotSegment,
    /// The path ends with `/`.
    #[error("path must not end with '/'")]
    TrailingSlash,
    /// The whole ID is longer than [`MAX_ID_LEN`] bytes.
    #[error("SPIFFE ID is {len} bytes long; at most {MAX_ID_LEN} are allowed")]
    TooLong {
        /// Length of the ID in bytes.
        len: usize,
    },
}

/// A SPIFFE trust domain name such as `cluster.local`.
///
/// Cheap to clone. Parsed with [`FromStr`] from the bare name (without `spiffe://`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TrustDomain(Arc<str>);

/// A SPIFFE ID such as `spiffe://cluster.local/ns/default/sa/web`.
///
/// Cheap to clone. Ordering, equality and hashing are those of the canonical string, which is
/// the only spelling [`FromStr`] accepts.
///
/// ```
/// use meshkit_identity::SpiffeId;
///
/// let id: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse()?;
/// assert_eq!(id.trust_domain().as_str(), "cluster.local");
/// assert_eq!(id.path(), "/ns/shop/sa/web");
/// assert_eq!(id.namespace(), Some("shop"));
/// assert_eq!(id.service_account(), Some("web"));
/// assert!("spiffe://Cluster.local/x".parse::<SpiffeId>().is_err());
/// # Ok::<(), meshkit_identity::SpiffeIdError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpiffeId {
    id: Arc<str>,
    /// Byte offset where the path starts (equal to `id.len()` when there is no path).
    path_start: usize,
}

// === impl TrustDomain ===

impl TrustDomain {
    /// Parses a bare trust domain name.
    ///
    /// # Errors
    ///
    /// [`SpiffeIdError::MissingTrustDomain`] for an empty name, otherwise the character or length
    /// error that applies.
    pub fn new(name: &str) -> Result<Self, SpiffeIdError> {
        validate_trust_domain(name)?;
        Ok(Self(name.into()))
    }

    /// The name, without scheme.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The SPIFFE ID of the trust domain itself (`spiffe://NAME`, no path).
    pub fn id(&self) -> SpiffeId {
        let id: Arc<str> = format!("{SCHEME}{}", self.0).into();
        SpiffeId {
            path_start: id.len(),
            id,
        }
    }

    /// Builds the ID `spiffe://NAME{path}`.
    ///
    /// # Errors
    ///
    /// The path error that applies, or [`SpiffeIdError::TooLong`].
    pub fn id_with_path(&self, path: &str) -> Result<SpiffeId, SpiffeIdError> {
        validate_path(path)?;
        let id = format!("{SCHEME}{}{path}", self.0);
        check_len(&id)?;
        Ok(SpiffeId {
            path_start: SCHEME.len() + self.0.len(),
            id: id.into(),
        })
    }
}

impl FromStr for TrustDomain {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for TrustDomain {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TrustDomain({})", self.0)
    }
}

// === impl SpiffeId ===

impl SpiffeId {
    /// Parses a SPIFFE ID; the same as [`str::parse`].
    ///
    /// # Errors
    ///
    /// The [`SpiffeIdError`] that names the first problem found.
    pub fn new(s: &str) -> Result<Self, SpiffeIdError> {
        if s.is_empty() {
            return Err(SpiffeIdError::Empty);
        }
        check_len(s)?;
        let rest = s.strip_prefix(SCHEME).ok_or(SpiffeIdError::WrongScheme)?;
        let td_end = rest.find('/').unwrap_or(rest.len());
        let (td, path) = rest.split_at(td_end);
        validate_trust_domain(td)?;
        validate_path(path)?;
        Ok(Self {
            path_start: SCHEME.len() + td_end,
            id: s.into(),
        })
    }

    /// The Istio workload identity `spiffe://TD/ns/NAMESPACE/sa/SERVICE_ACCOUNT`.
    ///
    /// # Errors
    ///
    /// The path error that applies when the namespace or service account is not a valid path
    /// segment (empty, `.`, or holding `/` or another forbidden character).
    pub fn from_istio(
        trust_domain: &TrustDomain,
        namespace: &str,
        service_account: &str,
    ) -> Result<Self, SpiffeIdError> {
        // Each part must be one segment: a '/' inside would make a valid ID of another shape.
        let path = format!("/ns/{namespace}/sa/{service_account}");
        for (part, offset) in [(namespace, 4), (service_account, 8 + namespace.len())] {
            if let Some(index) = part.find('/') {
                return Err(SpiffeIdError::BadPathChar {
                    found: '/',
                    index: offset + index,
                });
            }
        }
        trust_domain.id_with_path(&path)
    }

    /// The whole ID as a string.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The trust domain (a new handle; use [`SpiffeId::trust_domain_str`] to avoid allocating).
    pub fn trust_domain(&self) -> TrustDomain {
        TrustDomain(self.trust_domain_str().into())
    }

    /// The trust domain name as a borrowed string.
    pub fn trust_domain_str(&self) -> &str {
        &self.id[SCHEME.len()..self.path_start]
    }

    /// The path, starting with `/`, or `""` for the ID of a trust domain.
    pub fn path(&self) -> &str {
        &self.id[self.path_start..]
    }

    /// Whether this ID has a path (workload IDs do; trust domain IDs do not).
    pub fn has_path(&self) -> bool {
        self.path_start < self.id.len()
    }

    /// The namespace of an Istio identity (`/ns/NS/sa/SA`), or `None` when the path has another
    /// shape.
    pub fn namespace(&self) -> Option<&str> {
        self.istio_parts().map(|(ns, _)| ns)
    }

    /// The service account of an Istio identity (`/ns/NS/sa/SA`), or `None` when the path has
    /// another shape.
    pub fn service_account(&self) -> Option<&str> {
        self.istio_parts().map(|(_, sa)| sa)
    }

    fn istio_parts(&self) -> Option<(&str, &str)> {
        let mut segments = self.path().strip_prefix('/')?.split('/');
        match (
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
        ) {
            (Some("ns"), Some(ns), Some("sa"), Some(sa), None) => Some((ns, sa)),
            _ => None,
        }
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

impl fmt::Debug for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpiffeId({})", self.id)
    }
}

impl AsRef<str> for SpiffeId {
    fn as_ref(&self) -> &str {
        &self.id
    }
}

#[cfg(feature = "serde")]
mod serde_impls {
    use super::{SpiffeId, TrustDomain};

    impl serde::Serialize for SpiffeId {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(self.as_str())
        }
    }

    impl<'de> serde::Deserialize<'de> for SpiffeId {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
            s.parse().map_err(serde::de::Error::custom)
        }
    }

    impl serde::Serialize for TrustDomain {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_str(self.as_str())
        }
    }

    impl<'de> serde::Deserialize<'de> for TrustDomain {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
            s.parse().map_err(serde::de::Error::custom)
        }
    }
}

// === validation ===

fn check_len(id: &str) -> Result<(), SpiffeIdError> {
    if id.len() > MAX_ID_LEN {
        return Err(SpiffeIdError::TooLong { len: id.len() });
    }
    Ok(())
}

fn validate_trust_domain(td: &str) -> Result<(), SpiffeIdError> {
    if td.is_empty() {
        return Err(SpiffeIdError::MissingTrustDomain);
    }
    if let Some((index, found)) = td
        .char_indices()
        .find(|&(_, c)| !matches!(c, 'a'..='z' | '0'..='9' | '.' | '-' | '_'))
    {
        return Err(SpiffeIdError::BadTrustDomainChar { found, index });
    }
    if td.len() > MAX_TRUST_DOMAIN_LEN {
        return Err(SpiffeIdError::TrustDomainTooLong { len: td.len() });
    }
    Ok(())
}

/// Checks a path that is either empty or starts with `/`.
fn validate_path(path: &str) -> Result<(), SpiffeIdError> {
    if path.is_empty() {
        return Ok(());
    }
    let Some(body) = path.strip_prefix('/') else {
        // Only reachable through `id_with_path`: parsing splits at the first '/'.
        let found = path.chars().next().unwrap_or('/');
        return Err(SpiffeIdError::BadPathChar { found, index: 0 });
    };
    let mut offset = 1;
    for segment in body.split('/') {
        if segment.is_empty() {
            return Err(if offset == path.len() {
                SpiffeIdError::TrailingSlash
            } else {
                SpiffeIdError::EmptySegment
            });
        }
        if segment == "." || segment == ".." {
            return Err(SpiffeIdError::DotSegment);
        }
        if let Some((i, found)) = segment
            .char_indices()
            .find(|&(_, c)| !matches!(c, 'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_'))
        {
            return Err(SpiffeIdError::BadPathChar {
                found,
                index: offset + i,
            });
        }
        offset += segment.len() + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> SpiffeIdError {
        s.parse::<SpiffeId>().unwrap_err()
    }

    #[test]
    fn accepts_valid_ids() {
        for s in [
            "spiffe://example.org",
            "spiffe://example.org/ns/default/sa/web",
            "spiffe://a-b_c.9/Path.With-Mixed_Case/..x/.y",
            "spiffe://td/a",
        ] {
            let id: SpiffeId = s.parse().unwrap();
            assert_eq!(id.to_string(), s);
        }
    }

    #[test]
    fn parts() {
        let id: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().unwrap();
        assert_eq!(id.trust_domain_str(), "cluster.local");
        assert_eq!(
            id.trust_domain(),
            TrustDomain::new("cluster.local").unwrap()
        );
        assert_eq!(id.path(), "/ns/shop/sa/web");
        assert!(id.has_path());
        assert_eq!(id.namespace(), Some("shop"));
        assert_eq!(id.service_account(), Some("web"));

        let td: SpiffeId = "spiffe://cluster.local".parse().unwrap();
        assert_eq!(td.path(), "");
        assert!(!td.has_path());
        assert_eq!(td.namespace(), None);
        assert_eq!(td, td.trust_domain().id());

        let other: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web/extra"
            .parse()
            .unwrap();
        assert_eq!(other.namespace(), None);
        let other: SpiffeId = "spiffe://cluster.local/ns/shop/xx/web".parse().unwrap();
        assert_eq!(other.service_account(), None);
    }

    #[test]
    fn istio_helpers() {
        let td = TrustDomain::new("cluster.local").unwrap();
        let id = SpiffeId::from_istio(&td, "shop", "web").unwrap();
        assert_eq!(id.as_str(), "spiffe://cluster.local/ns/shop/sa/web");
        assert_eq!(
            SpiffeId::from_istio(&td, "", "web").unwrap_err(),
            SpiffeIdError::EmptySegment
        );
        // A '/' inside a part would silently change the identity's shape.
        assert_eq!(
            SpiffeId::from_istio(&td, "a/b", "web").unwrap_err(),
            SpiffeIdError::BadPathChar {
                found: '/',
                index: 5
            }
        );
        assert!(SpiffeId::from_istio(&td, "..", "web").is_err());
    }

    #[test]
    fn rejects_each_problem_with_its_own_error() {
        use SpiffeIdError::*;
        assert_eq!(err(""), Empty);
        assert_eq!(err("SPIFFE://example.org/a"), WrongScheme);
        assert_eq!(err("https://example.org/a"), WrongScheme);
        assert_eq!(err("spiffe:/example.org/a"), WrongScheme);
        assert_eq!(err("spiffe://"), MissingTrustDomain);
        assert_eq!(err("spiffe:///path"), MissingTrustDomain);
        assert_eq!(
            err("spiffe://Example.org/a"),
            BadTrustDomainChar {
                found: 'E',
                index: 0
            }
        );
        assert_eq!(
            err("spiffe://example.org:8080/a"),
            BadTrustDomainChar {
                found: ':',
                index: 11
            }
        );
        assert_eq!(
            err("spiffe://user@example.org/a"),
            BadTrustDomainChar {
                found: '@',
                index: 4
            }
        );
        assert_eq!(
            err("spiffe://ex%41mple.org"),
            BadTrustDomainChar {
                found: '%',
                index: 2
            }
        );
        assert_eq!(
            err("spiffe://example.org?q"),
            BadTrustDomainChar {
                found: '?',
                index: 11
            }
        );
        assert_eq!(
            err("spiffe://example.org/a?q=1"),
            BadPathChar {
                found: '?',
                index: 2
            }
        );
        assert_eq!(
            err("spiffe://example.org/a#frag"),
            BadPathChar {
                found: '#',
                index: 2
            }
        );
        assert_eq!(
            err("spiffe://example.org/a/b%20"),
            BadPathChar {
                found: '%',
                index: 4
            }
        );
        assert_eq!(err("spiffe://example.org/a//b"), EmptySegment);
        assert_eq!(err("spiffe://example.org//"), EmptySegment);
        assert_eq!(err("spiffe://example.org/"), TrailingSlash);
        assert_eq!(err("spiffe://example.org/a/"), TrailingSlash);
        assert_eq!(err("spiffe://example.org/./a"), DotSegment);
        assert_eq!(err("spiffe://example.org/a/.."), DotSegment);
        let long_td = format!("spiffe://{}/a", "a".repeat(256));
        assert_eq!(err(&long_td), TrustDomainTooLong { len: 256 });
        let long = format!("spiffe://example.org/{}", "a".repeat(2048));
        assert_eq!(err(&long), TooLong { len: long.len() });
    }

    #[test]
    fn length_limits_are_inclusive() {
        let td = "a".repeat(255);
        assert!(format!("spiffe://{td}/x").parse::<SpiffeId>().is_ok());
        let path = "b".repeat(MAX_ID_LEN - "spiffe://example.org/".len());
        let id = format!("spiffe://example.org/{path}");
        assert_eq!(id.len(), MAX_ID_LEN);
        assert!(id.parse::<SpiffeId>().is_ok());
    }

    #[test]
    fn trust_domain_parsing() {
        assert_eq!(
            TrustDomain::new("").unwrap_err(),
            SpiffeIdError::MissingTrustDomain
        );
        assert!(matches!(
            TrustDomain::new("spiffe://example.org").unwrap_err(),
            SpiffeIdError::BadTrustDomainChar { found: ':', .. }
        ));
        assert_eq!(
            TrustDomain::new("example.org").unwrap().to_string(),
            "example.org"
        );
    }
}
