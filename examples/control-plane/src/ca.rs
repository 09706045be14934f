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
use std::time::Duration;

use meshkit_identity::istio::{
    CertificateSigner, IstioCertificateRequest, IstioCertificateResponse, requested_validity,
};
use meshkit_identity::{BoxFuture, CaSigner, ErrorChain, SpiffeId, certs_to_pem};
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

/// A [`CertificateSigner`] for [`meshkit_identity::istio::IstioCaServer`]: authenticates the
/// bearer token, checks the requested identity against the token's grants, signs.
pub struct TokenSigner {
    ca: CaSigner,
    grants: TokenGrants,
}

/// A problem with the token file.
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

// === impl TokenSigner ===

impl TokenSigner {
    /// Signs with `ca` for callers holding a token of `grants`, granting at most
    /// [`MAX_VALIDITY`].
    pub fn new(ca: CaSigner, grants: TokenGrants) -> Self {
        Self {
            ca: ca.with_max_validity(MAX_VALIDITY),
            grants,
        }
    }

    /// The root certificate as PEM.
    pub fn root_pem(&self) -> String {
        self.ca.root_pem()
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
        let id = CaSigner::csr_spiffe_id(&request.csr)
            .map_err(|e| Status::invalid_argument(ErrorChain(&e).to_string()))?;
        if id.trust_domain() != *self.ca.trust_domain() {
            return Err(Status::permission_denied(format!(
                "{id} is not in trust domain {}",
                self.ca.trust_domain()
            )));
        }
        if !self.grants.allows(token, &id) {
            tracing::warn!(%id, "CA: token may not request this identity");
            return Err(Status::permission_denied(format!(
                "this token may not request {id}"
            )));
        }
        let validity = requested_validity(request, DEFAULT_VALIDITY).min(MAX_VALIDITY);
        let mut chain = self
            .ca
            .sign_csr(&request.csr, &id, validity)
            .map_err(|e| Status::invalid_argument(ErrorChain(&e).to_string()))?;
        // Istio's protocol: the chain ends with the root.
        chain.push(self.ca.root().clone());
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
            .field("ca", &self.ca)
            .field("grants", &self.grants)
            .finish()
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
