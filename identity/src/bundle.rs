//! Trust bundles: the root certificates of one trust domain, and sets of bundles keyed by trust
//! domain. Bundles are never merged: a peer is checked against its own trust domain's roots.

use std::collections::HashMap;
use std::fmt;

use base64::Engine as _;
use rustls_pki_types::{CertificateDer, TrustAnchor};
use serde::Deserialize as _;
use serde::de::{Deserializer, MapAccess, Visitor};

use crate::spiffe::{SpiffeIdError, TrustDomain};
use crate::svid::{SvidError, certs_from_pem};

/// Why a trust bundle or bundle set could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// PEM input could not be read, or held no certificate.
    #[error("invalid PEM bundle")]
    Pem(#[source] SvidError),
    /// A certificate cannot serve as a trust anchor.
    #[error("certificate {index} of the bundle is not a usable trust anchor: {reason}")]
    BadRoot {
        /// Position of the certificate in the input.
        index: usize,
        /// Why it was rejected.
        reason: String,
    },
    /// A bundle holds no X.509 root.
    #[error("bundle for {0} holds no X.509 authority")]
    NoRoots(TrustDomain),
    /// The JSON is not a SPIFFE bundle (or a map of bundles).
    #[error("invalid SPIFFE bundle JSON")]
    Json(#[source] serde_json::Error),
    /// An `x509-svid` key does not have exactly one `x5c` certificate.
    #[error("x509-svid key {index} has {count} x5c entries; exactly one is required")]
    X5cCount {
        /// Position of the key in `keys`.
        index: usize,
        /// Number of `x5c` entries found.
        count: usize,
    },
    /// An `x5c` entry is not standard base64.
    #[error("x509-svid key {index}: x5c is not base64: {reason}")]
    X5cBase64 {
        /// Position of the key in `keys`.
        index: usize,
        /// The decoder's message.
        reason: String,
    },
    /// A trust domain name in a bundle map is invalid.
    #[error("invalid trust domain {name:?}")]
    TrustDomain {
        /// The name as found.
        name: String,
        /// What is wrong with it.
        #[source]
        source: SpiffeIdError,
    },
    /// Two bundles were given for the same trust domain.
    #[error("more than one bundle for trust domain {0}")]
    DuplicateTrustDomain(TrustDomain),
}

/// The X.509 authorities of one trust domain.
#[derive(Clone)]
pub struct TrustBundle {
    trust_domain: TrustDomain,
    roots: Vec<CertificateDer<'static>>,
    anchors: Vec<TrustAnchor<'static>>,
    /// Each root's validity, `not_before` and `not_after` in seconds since the Unix epoch:
    /// path building ignores an anchor's, and a root outside it verifies nothing.
    validity: Vec<(i64, i64)>,
}

/// Trust bundles keyed by trust domain; at most one bundle per trust domain.
#[derive(Clone, Default)]
pub struct TrustBundleSet {
    bundles: HashMap<TrustDomain, TrustBundle>,
}

// === impl TrustBundle ===

impl TrustBundle {
    /// A bundle from DER root certificates.
    ///
    /// # Errors
    ///
    /// [`BundleError::NoRoots`] for an empty list, [`BundleError::BadRoot`] for a certificate
    /// that cannot be parsed as a trust anchor.
    pub fn from_der(
        trust_domain: TrustDomain,
        roots: Vec<CertificateDer<'static>>,
    ) -> Result<Self, BundleError> {
        if roots.is_empty() {
            return Err(BundleError::NoRoots(trust_domain));
        }
        let anchors = roots
            .iter()
            .enumerate()
            .map(|(index, der)| {
                webpki::anchor_from_trusted_cert(der)
                    .map(|a| a.to_owned())
                    .map_err(|e| BundleError::BadRoot {
                        index,
                        reason: e.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        let validity = roots
            .iter()
            .enumerate()
            .map(|(index, der)| {
                let (_, cert) =
                    x509_parser::parse_x509_certificate(der).map_err(|e| BundleError::BadRoot {
                        index,
                        reason: e.to_string(),
                    })?;
                let validity = cert.validity();
                Ok((
                    validity.not_before.timestamp(),
                    validity.not_after.timestamp(),
                ))
            })
            .collect::<Result<_, BundleError>>()?;
        Ok(Self {
            trust_domain,
            roots,
            anchors,
            validity,
        })
    }

    /// A bundle from PEM root certificates.
    ///
    /// # Errors
    ///
    /// [`BundleError::Pem`] for unreadable or empty PEM, otherwise as [`TrustBundle::from_der`].
    pub fn from_pem(trust_domain: TrustDomain, pem: &str) -> Result<Self, BundleError> {
        Self::from_der(trust_domain, certs_from_pem(pem).map_err(BundleError::Pem)?)
    }

    /// A bundle from the SPIFFE bundle format (a JWK Set whose `x509-svid` keys carry one DER
    /// certificate each in `x5c`). Keys for other uses, such as `jwt-svid`, are ignored.
    ///
    /// # Errors
    ///
    /// [`BundleError::Json`] when the document is not a JWK Set, [`BundleError::X5cCount`] or
    /// [`BundleError::X5cBase64`] for a malformed key, otherwise as [`TrustBundle::from_der`].
    pub fn from_jwks(trust_domain: TrustDomain, json: &str) -> Result<Self, BundleError> {
        let doc: serde_json::Value = serde_json::from_str(json).map_err(BundleError::Json)?;
        Self::from_jwks_value(trust_domain, &doc)
    }

    fn from_jwks_value(
        trust_domain: TrustDomain,
        doc: &serde_json::Value,
    ) -> Result<Self, BundleError> {
        #[derive(serde::Deserialize)]
        struct Jwks {
            keys: Vec<Jwk>,
        }
        #[derive(serde::Deserialize)]
        struct Jwk {
            #[serde(rename = "use", default)]
            usage: Option<String>,
            #[serde(default)]
            x5c: Vec<String>,
        }
        let jwks = Jwks::deserialize(doc).map_err(BundleError::Json)?;
        let mut roots = Vec::new();
        for (index, key) in jwks.keys.iter().enumerate() {
            if key.usage.as_deref() != Some("x509-svid") {
                continue;
            }
            let [x5c] = key.x5c.as_slice() else {
                return Err(BundleError::X5cCount {
                    index,
                    count: key.x5c.len(),
                });
            };
            let der = base64::engine::general_purpose::STANDARD
                .decode(x5c)
                .map_err(|e| BundleError::X5cBase64 {
                    index,
                    reason: e.to_string(),
                })?;
            roots.push(CertificateDer::from(der));
        }
        Self::from_der(trust_domain, roots)
    }

    /// The SPIFFE bundle format (JWK Set) for this bundle's X.509 authorities.
    pub fn to_jwks(&self) -> String {
        let keys: Vec<_> = self
            .roots
            .iter()
            .map(|der| {
                serde_json::json!({
                    "use": "x509-svid",
                    "x5c": [base64::engine::general_purpose::STANDARD.encode(der)],
                })
            })
            .collect();
        serde_json::json!({ "keys": keys }).to_string()
    }

    /// The trust domain these roots speak for.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The root certificates.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    pub(crate) fn anchors(&self) -> &[TrustAnchor<'static>] {
        &self.anchors
    }

    /// The anchors of the roots valid at `now` (seconds since the Unix epoch), borrowed when
    /// every root is.
    pub(crate) fn anchors_at(&self, now: u64) -> std::borrow::Cow<'_, [TrustAnchor<'static>]> {
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let valid = |(not_before, not_after): &(i64, i64)| *not_before <= now && now <= *not_after;
        if self.validity.iter().all(valid) {
            return std::borrow::Cow::Borrowed(&self.anchors);
        }
        let anchors = self.anchors.iter().zip(&self.validity);
        std::borrow::Cow::Owned(
            anchors
                .filter(|(_, v)| valid(v))
                .map(|(a, _)| a.clone())
                .collect(),
        )
    }
}

impl fmt::Debug for TrustBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrustBundle")
            .field("trust_domain", &self.trust_domain)
            .field("roots", &self.roots.len())
            .finish()
    }
}

// === impl TrustBundleSet ===

impl TrustBundleSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a bundle.
    ///
    /// # Errors
    ///
    /// [`BundleError::DuplicateTrustDomain`] when the set already holds a bundle for that trust
    /// domain: replacing roots silently would hide a configuration mistake.
    pub fn insert(&mut self, bundle: TrustBundle) -> Result<(), BundleError> {
        use std::collections::hash_map::Entry;
        match self.bundles.entry(bundle.trust_domain.clone()) {
            Entry::Occupied(e) => Err(BundleError::DuplicateTrustDomain(e.key().clone())),
            Entry::Vacant(e) => {
                e.insert(bundle);
                Ok(())
            }
        }
    }

    /// Builds a set from bundles.
    ///
    /// # Errors
    ///
    /// [`BundleError::DuplicateTrustDomain`] when two bundles share a trust domain.
    pub fn from_bundles(
        bundles: impl IntoIterator<Item = TrustBundle>,
    ) -> Result<Self, BundleError> {
        let mut set = Self::new();
        for bundle in bundles {
            set.insert(bundle)?;
        }
        Ok(set)
    }

    /// Builds a set from a JSON object mapping trust domain names to SPIFFE bundles
    /// (`{"example.org": {"keys": [...]}, ...}`), as federation endpoints publish them.
    ///
    /// # Errors
    ///
    /// [`BundleError::DuplicateTrustDomain`] when a name appears twice in the object (JSON
    /// parsers usually keep the last silently; this one refuses), [`BundleError::TrustDomain`]
    /// for an invalid name, otherwise as [`TrustBundle::from_jwks`].
    pub fn from_jwks_map(json: &str) -> Result<Self, BundleError> {
        let mut de = serde_json::Deserializer::from_str(json);
        let entries = de
            .deserialize_map(EntriesVisitor)
            .and_then(|entries| de.end().map(|()| entries))
            .map_err(BundleError::Json)?;
        let mut set = Self::new();
        for (name, doc) in entries {
            let td = TrustDomain::new(&name)
                .map_err(|source| BundleError::TrustDomain { name, source })?;
            set.insert(TrustBundle::from_jwks_value(td, &doc)?)?;
        }
        Ok(set)
    }

    /// The bundle for a trust domain, by name.
    pub fn get(&self, trust_domain: &str) -> Option<&TrustBundle> {
        self.bundles.get(trust_domain)
    }

    /// The trust domains in the set.
    pub fn trust_domains(&self) -> impl Iterator<Item = &TrustDomain> {
        self.bundles.keys()
    }

    /// Number of bundles.
    pub fn len(&self) -> usize {
        self.bundles.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bundles.is_empty()
    }
}

impl From<TrustBundle> for TrustBundleSet {
    fn from(bundle: TrustBundle) -> Self {
        let mut set = Self::new();
        set.bundles.insert(bundle.trust_domain.clone(), bundle);
        set
    }
}

impl fmt::Debug for TrustBundleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.bundles.values()).finish()
    }
}

/// Reads a JSON object as ordered (key, value) pairs, keeping duplicate keys.
struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, serde_json::Value)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object mapping trust domain names to SPIFFE bundles")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(entries)
    }
}
