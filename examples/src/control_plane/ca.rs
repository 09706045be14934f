//! The control plane's certificate authority: `istio.v1.auth.IstioCertificateService` with a
//! bootstrap-token trust model.
//!
//! # Trust model (the demo's, not a production one)
//!
//! A caller proves which identities it may hold with a bearer token (`authorization: Bearer
//! TOKEN`), looked up in a [`TokenGrants`] table loaded from a file the operator writes. Each
//! token grants a set of SPIFFE IDs (exact, or a prefix ending in `/*`). A CSR is signed only
//! when its single URI SAN is in the caller's set and in the CA's trust domain. Istio instead
//! verifies Kubernetes service account tokens with the API server (TokenReview) and derives
//! the identity from them; here whoever holds a token file line holds those identities, so the
//! file must be protected like a key. See `docs/control-plane.md`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use meshkit_identity::istio::{
    CertificateSigner, IstioCertificateRequest, IstioCertificateResponse, requested_validity,
};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{BoxFuture, SpiffeId, TrustDomain, certs_to_pem};
use rcgen::{CertificateSigningRequestParams, Issuer, KeyPair, SanType};
use rustls_pki_types::CertificateDer;
use tonic::Status;

/// Default validity of issued certificates when the request names none.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// Longest validity granted, whatever is asked.
pub const MAX_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// Which identities each bootstrap token may request.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TokenGrants {
    grants: BTreeMap<String, Vec<IdPattern>>,
}

/// An exact SPIFFE ID, or every ID under a prefix (`spiffe://td/ns/shop/*`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum IdPattern {
    Exact(SpiffeId),
    Prefix(String),
}

/// The CA's signing key and root: generated at start or loaded from PEM files.
pub struct CaKeys {
    trust_domain: TrustDomain,
    inner: Keys,
}

enum Keys {
    Generated(TestCa),
    Loaded {
        issuer: Issuer<'static, KeyPair>,
        root: CertificateDer<'static>,
    },
}

/// A [`CertificateSigner`] for [`meshkit_identity::istio::IstioCaServer`]: authenticates the
/// bearer token, checks the requested identity against the token's grants, signs.
pub struct TokenSigner {
    keys: CaKeys,
    grants: TokenGrants,
}

/// A problem with the token file or the CA files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaConfigError(String);

// === impl TokenGrants ===

impl TokenGrants {
    /// No tokens: every request is refused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Grants `token` the identities matched by `pattern`: a SPIFFE ID, or a prefix ending in
    /// `/*` such as `spiffe://cluster.local/ns/shop/*`.
    ///
    /// # Errors
    ///
    /// When the pattern is neither.
    pub fn grant(mut self, token: &str, pattern: &str) -> Result<Self, CaConfigError> {
        let pattern = parse_pattern(pattern)?;
        self.grants
            .entry(token.to_owned())
            .or_default()
            .push(pattern);
        Ok(self)
    }

    /// Parses the token file: one token per line followed by the identities it grants,
    /// separated by whitespace; `#` starts a comment.
    ///
    /// ```text
    /// # token            identities
    /// node-a-7f3c9e      spiffe://cluster.local/ns/shop/* spiffe://cluster.local/ns/infra/sa/gateway
    /// ```
    ///
    /// # Errors
    ///
    /// Names the line of a token without identities or of an invalid identity.
    pub fn parse(text: &str) -> Result<Self, CaConfigError> {
        let mut grants = Self::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let Some(token) = words.next() else { continue };
            let mut any = false;
            for pattern in words {
                grants = grants
                    .grant(token, pattern)
                    .map_err(|e| CaConfigError(format!("line {}: {}", i + 1, e.0)))?;
                any = true;
            }
            if !any {
                return Err(CaConfigError(format!(
                    "line {}: token without identities",
                    i + 1
                )));
            }
        }
        Ok(grants)
    }

    /// Reads and parses a token file.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or parsed; the message names it.
    pub fn load(path: &Path) -> Result<Self, CaConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CaConfigError(format!("cannot read token file {}: {e}", path.display()))
        })?;
        Self::parse(&text).map_err(|e| CaConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// Whether `token` may hold `id`.
    pub fn allows(&self, token: &str, id: &SpiffeId) -> bool {
        self.patterns(token)
            .is_some_and(|patterns| patterns.iter().any(|p| p.matches(id)))
    }

    /// The patterns of a token, comparing every token in full so that timing does not reveal
    /// how much of a guess was right.
    fn patterns(&self, token: &str) -> Option<&[IdPattern]> {
        let mut found = None;
        for (known, patterns) in &self.grants {
            if constant_time_eq(known.as_bytes(), token.as_bytes()) {
                found = Some(patterns.as_slice());
            }
        }
        found
    }

    /// How many tokens are known.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// Whether no token is known.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }
}

impl std::fmt::Debug for TokenGrants {
    /// Tokens are secrets: only their number is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenGrants")
            .field("tokens", &self.grants.len())
            .finish()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn parse_pattern(pattern: &str) -> Result<IdPattern, CaConfigError> {
    if let Some(prefix) = pattern.strip_suffix("/*") {
        // The prefix itself must be a valid ID, so patterns cannot cross trust domains oddly.
        prefix
            .parse::<SpiffeId>()
            .map_err(|e| CaConfigError(format!("{pattern:?} is not a SPIFFE ID prefix: {e}")))?;
        return Ok(IdPattern::Prefix(format!("{prefix}/")));
    }
    pattern
        .parse::<SpiffeId>()
        .map(IdPattern::Exact)
        .map_err(|e| CaConfigError(format!("{pattern:?} is not a SPIFFE ID: {e}")))
}

impl IdPattern {
    fn matches(&self, id: &SpiffeId) -> bool {
        match self {
            Self::Exact(exact) => exact == id,
            Self::Prefix(prefix) => id.as_str().starts_with(prefix.as_str()),
        }
    }
}

// === impl CaKeys ===

impl CaKeys {
    /// A new self-signed root for `trust_domain`, valid ten years.
    pub fn generate(trust_domain: TrustDomain) -> Self {
        Self {
            trust_domain: trust_domain.clone(),
            inner: Keys::Generated(TestCa::new(trust_domain)),
        }
    }

    /// A root loaded from a PEM certificate and a PEM private key (PKCS#8, ECDSA P-256 or
    /// another algorithm rcgen signs with).
    ///
    /// # Errors
    ///
    /// When the files cannot be read or do not hold a CA certificate and its key.
    pub fn load(trust_domain: TrustDomain, cert: &Path, key: &Path) -> Result<Self, CaConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p)
                .map_err(|e| CaConfigError(format!("cannot read {}: {e}", p.display())))
        };
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        let key_pair = KeyPair::from_pem(&key_pem).map_err(|e| {
            CaConfigError(format!("{}: not a usable private key: {e}", key.display()))
        })?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key_pair).map_err(|e| {
            CaConfigError(format!(
                "{}: not a usable CA certificate: {e}",
                cert.display()
            ))
        })?;
        let root = meshkit_identity::certs_from_pem(&cert_pem)
            .ok()
            .and_then(|certs| certs.into_iter().next())
            .ok_or_else(|| CaConfigError(format!("{}: no certificate", cert.display())))?;
        Ok(Self {
            trust_domain,
            inner: Keys::Loaded { issuer, root },
        })
    }

    /// The trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The root certificate as PEM (the trust bundle of the mesh).
    pub fn root_pem(&self) -> String {
        match &self.inner {
            Keys::Generated(ca) => ca.root_pem(),
            Keys::Loaded { root, .. } => certs_to_pem(std::slice::from_ref(root)),
        }
    }

    /// Signs a PEM CSR for `id`: leaf first, then the root.
    fn sign(
        &self,
        csr_pem: &str,
        id: &SpiffeId,
        validity: Duration,
    ) -> Result<Vec<CertificateDer<'static>>, Status> {
        match &self.inner {
            Keys::Generated(ca) => {
                let mut chain = ca
                    .sign_csr(csr_pem, id, validity)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?;
                chain.push(ca.root().clone());
                Ok(chain)
            }
            Keys::Loaded { issuer, root } => {
                let csr = CertificateSigningRequestParams::from_pem(csr_pem)
                    .map_err(|e| Status::invalid_argument(format!("malformed CSR: {e}")))?;
                let mut params = TestCa::leaf_params(id);
                let now = time::OffsetDateTime::from(SystemTime::now());
                params.not_before = now - time::Duration::minutes(1);
                params.not_after = now + validity;
                let leaf = CertificateSigningRequestParams {
                    params,
                    public_key: csr.public_key,
                }
                .signed_by(issuer)
                .map_err(|e| Status::internal(format!("signing failed: {e}")))?;
                Ok(vec![leaf.der().clone(), root.clone()])
            }
        }
    }
}

impl std::fmt::Debug for CaKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaKeys")
            .field("trust_domain", &self.trust_domain)
            .field(
                "source",
                &match self.inner {
                    Keys::Generated(_) => "generated",
                    Keys::Loaded { .. } => "loaded",
                },
            )
            .finish_non_exhaustive()
    }
}

// === impl TokenSigner ===

impl TokenSigner {
    /// Signs with `keys` for callers holding a token of `grants`.
    pub fn new(keys: CaKeys, grants: TokenGrants) -> Self {
        Self { keys, grants }
    }

    /// The root certificate as PEM.
    pub fn root_pem(&self) -> String {
        self.keys.root_pem()
    }

    /// The whole decision, without gRPC plumbing: token from `authorization`, identity from
    /// the CSR, grant check, signature.
    fn decide(
        &self,
        authorization: Option<&str>,
        request: &IstioCertificateRequest,
    ) -> Result<IstioCertificateResponse, Status> {
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Status::unauthenticated("a bearer token is required"))?;
        if self.grants.patterns(token).is_none() {
            return Err(Status::unauthenticated("unknown bootstrap token"));
        }
        let id = requested_id(&request.csr)?;
        if id.trust_domain() != self.keys.trust_domain {
            return Err(Status::permission_denied(format!(
                "{id} is not in trust domain {}",
                self.keys.trust_domain
            )));
        }
        if !self.grants.allows(token, &id) {
            tracing::warn!(%id, "CA: token may not request this identity");
            return Err(Status::permission_denied(format!(
                "this token may not request {id}"
            )));
        }
        let validity = requested_validity(request, DEFAULT_VALIDITY).min(MAX_VALIDITY);
        let chain = self.keys.sign(&request.csr, &id, validity)?;
        tracing::info!(%id, validity_secs = validity.as_secs(), "CA: certificate issued");
        Ok(IstioCertificateResponse {
            cert_chain: chain
                .iter()
                .map(|c| certs_to_pem(std::slice::from_ref(c)))
                .collect(),
        })
    }
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("keys", &self.keys)
            .field("grants", &self.grants)
            .finish()
    }
}

/// The identity a CSR asks for: its only SAN, a URI that is a SPIFFE ID.
fn requested_id(csr_pem: &str) -> Result<SpiffeId, Status> {
    let csr = CertificateSigningRequestParams::from_pem(csr_pem)
        .map_err(|e| Status::invalid_argument(format!("malformed CSR: {e}")))?;
    match csr.params.subject_alt_names.as_slice() {
        [SanType::URI(uri)] => uri
            .as_str()
            .parse::<SpiffeId>()
            .map_err(|e| Status::invalid_argument(format!("CSR URI SAN is not a SPIFFE ID: {e}"))),
        _ => Err(Status::invalid_argument(
            "CSR must carry exactly one SAN, a SPIFFE ID URI",
        )),
    }
}

impl CertificateSigner for TokenSigner {
    fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> BoxFuture<'_, Result<IstioCertificateResponse, Status>> {
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let result = self.decide(authorization.as_deref(), request.get_ref());
        Box::pin(std::future::ready(result))
    }
}

// === impl CaConfigError ===

impl std::fmt::Display for CaConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CaConfigError {}
