//! The control plane's certificate authority: `istio.v1.auth.IstioCertificateService` with a
//! bootstrap-token trust model.
//!
//! # Trust model (the demo's, not a production one)
//!
//! A caller proves which identities it may hold with a bearer token (`authorization: Bearer
//! TOKEN`), looked up in a [`TokenGrants`] table loaded from a file the operator writes. Each
//! token grants a set of SPIFFE IDs (exact, or a prefix ending in `/*`). A CSR is signed only
//! when its single URI SAN is in the caller's set and in the CA's trust domain. Whoever holds
//! a token file line holds those identities, so the file must be protected like a key. With
//! Kubernetes, the callers' own ServiceAccount tokens, verified by the API server, are the
//! credentials instead ([`crate::service_accounts`]). See `docs/control-plane.md`.
//!
//! # Node proxies: Istio's impersonation rule
//!
//! A node proxy (ztunnel in shared mode, meshkit's node proxy) holds its own credential and
//! requests certificates for the workloads on its node, naming each in the request's
//! `metadata` as `ImpersonatedIdentity`. Such a request is signed only when the token's line
//! says `node=NAME`, the named identity is the CSR's, and a workload of node `NAME` in the
//! current manifests has that identity ([`NodeIdentities`]). A `node=NAME` token's request
//! that names none (ztunnel in dedicated mode, asking for its own workload's identity) is
//! held to the same rule for the CSR's identity: a node's credential obtains certificates for
//! the workloads on its own node and for nothing else, whatever identities the token's line
//! lists. Other tokens' requests without `ImpersonatedIdentity` are checked against the
//! token's identities.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::IpAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use meshkit_identity::istio::{
    CertificateSigner, IstioCaServer, IstioCertificateRequest, IstioCertificateResponse,
    impersonated_identity, requested_validity,
};
use meshkit_identity::{BoxFuture, CaSigner, ErrorChain, SignError, SpiffeId, certs_to_pem};
use meshkit_xds_server::{Admission, AdmissionDeadline};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_stream::{Stream, StreamExt};
use tonic::Status;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::transport::server::Connected;

use crate::metrics::{CaMetrics, CaRefusal};
use crate::service_accounts::{Caller, Reviewer, looks_like_jwt};
use crate::shares::{Held, Tally};

/// Default validity of issued certificates when the request names none.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(24 * 3600);
/// Longest validity granted, whatever is asked.
pub const MAX_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);

/// Which identities each bootstrap token may request.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TokenGrants {
    grants: BTreeMap<String, Vec<IdPattern>>,
    /// What each token may be over ADS (`node=NAME`, `gateway=NAME`); see
    /// [`crate::access`].
    roles: BTreeMap<String, crate::access::XdsRole>,
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
    auth: Authenticator,
    max_csr_bytes: usize,
    metrics: CaMetrics,
    nodes: watch::Receiver<Arc<NodeIdentities>>,
}

/// Who a caller is, from its `authorization` header alone: the token file's grants as they
/// are now, and the ServiceAccount reviewer when ServiceAccount tokens are taken. The CA
/// service runs it before a call takes any place ([`ConcurrencyLimited`]); the signer runs it
/// again for its decision (a cheap lookup, or a cached review).
#[derive(Clone)]
struct Authenticator {
    grants: watch::Receiver<Arc<TokenGrants>>,
    accounts: Option<Arc<Reviewer>>,
}

/// Who a caller is, by its credential.
enum Credential<'t> {
    /// A token of the token file.
    Bootstrap(&'t str),
    /// A ServiceAccount token, reviewed.
    Account(Caller),
}

/// The identities of the workloads on each node: what a node proxy's credential may request
/// certificates for on their behalf; and the node of each Pod, for a node proxy's Pod-bound
/// ServiceAccount token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentities {
    identities: BTreeMap<String, BTreeSet<SpiffeId>>,
    /// `(namespace, name)` to `(uid, node)`.
    pods: BTreeMap<(String, String), (String, Option<String>)>,
}

// === impl NodeIdentities ===

impl NodeIdentities {
    /// No node has workloads.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that a workload with identity `id` runs on `node`.
    pub fn insert(&mut self, node: &str, id: SpiffeId) {
        self.identities
            .entry(node.to_owned())
            .or_default()
            .insert(id);
    }

    /// Whether a workload with identity `id` runs on `node`.
    pub fn contains(&self, node: &str, id: &SpiffeId) -> bool {
        self.identities
            .get(node)
            .is_some_and(|ids| ids.contains(id))
    }

    /// Records each of `pods`, with its uid and node.
    pub fn with_pods(mut self, pods: &[k8s_openapi::api::core::v1::Pod]) -> Self {
        for pod in pods {
            let meta = &pod.metadata;
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let (Some(namespace), Some(name), Some(uid)) =
                (meta.namespace.clone(), meta.name.clone(), meta.uid.clone())
            {
                self.pods.insert((namespace, name), (uid, node));
            }
        }
        self
    }

    /// Whether Pod `namespace/name` exists with uid `uid` (a Pod of the same name created
    /// anew is another Pod).
    pub fn has_pod(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .is_some_and(|(known, _)| known == uid)
    }

    /// The node of Pod `namespace/name`, when it exists with uid `uid` and runs on a node.
    pub fn node_of_pod(&self, namespace: &str, name: &str, uid: &str) -> Option<&str> {
        self.pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .filter(|(known, _)| known == uid)
            .and_then(|(_, node)| node.as_deref())
    }

    /// The workloads that name a node (Pods and WorkloadEntries), with their identities in
    /// `trust_domain`.
    pub fn of_workloads(
        workloads: &[crate::ambient::MeshWorkload],
        trust_domain: &meshkit_identity::TrustDomain,
    ) -> Self {
        let mut nodes = Self::new();
        for w in workloads.iter().map(|w| &w.workload) {
            if w.node.is_empty() || w.service_account.is_empty() {
                continue;
            }
            if let Ok(id) = SpiffeId::from_istio(trust_domain, &w.namespace, &w.service_account) {
                nodes.insert(&w.node, id);
            }
        }
        nodes
    }
}

/// A problem with the token file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaConfigError {
    /// The file could not be read.
    #[error("cannot read token file {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of the file is wrong.
    #[error("{}line {line}", file.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
    Line {
        /// The file, when the text came from one.
        file: Option<std::path::PathBuf>,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        #[source]
        problem: LineProblem,
    },
    /// A pattern given to [`TokenGrants::grant`] is neither a SPIFFE ID nor a prefix of one.
    #[error(transparent)]
    Pattern(#[from] PatternError),
}

/// What is wrong with a line of the token file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineProblem {
    /// The token is followed by no identity and no xDS role.
    #[error("token without identities")]
    NoIdentities,
    /// A `node=` or `gateway=` word does not parse.
    #[error(transparent)]
    Role(#[from] crate::access::RoleWordError),
    /// An identity pattern does not parse.
    #[error(transparent)]
    Pattern(#[from] PatternError),
}

/// An identity pattern that is neither a SPIFFE ID nor a prefix of one ending in `/*`.
#[derive(Debug, thiserror::Error)]
#[error("{pattern:?} is not a SPIFFE ID{}", if *prefix { " prefix" } else { "" })]
pub struct PatternError {
    /// The pattern as written.
    pub pattern: String,
    /// Whether it was written as a prefix (`.../*`).
    pub prefix: bool,
    /// Why its ID does not parse.
    #[source]
    pub source: meshkit_identity::SpiffeIdError,
}

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
    /// separated by whitespace; `#` starts a comment. A word `node=NAME` or `gateway=NAME`
    /// also lets the token connect to ADS as that node proxy or gateway (see
    /// [`crate::access`]); a line needs at least one identity or role.
    ///
    /// ```text
    /// # token            xDS role      identities
    /// node-a-7f3c9e      node=node-a   spiffe://cluster.local/ns/shop/* spiffe://cluster.local/ns/infra/sa/gateway
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
            let at_line = |problem: LineProblem| CaConfigError::Line {
                file: None,
                line: i + 1,
                problem,
            };
            for pattern in words {
                if let Some(role) =
                    crate::access::XdsRole::parse_word(pattern).map_err(|e| at_line(e.into()))?
                {
                    grants = grants.with_xds_role(token, role);
                    any = true;
                    continue;
                }
                let pattern = parse_pattern(pattern).map_err(|e| at_line(e.into()))?;
                grants
                    .grants
                    .entry(token.to_owned())
                    .or_default()
                    .push(pattern);
                any = true;
            }
            if !any {
                return Err(at_line(LineProblem::NoIdentities));
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
        let text = std::fs::read_to_string(path).map_err(|source| CaConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            CaConfigError::Line { line, problem, .. } => CaConfigError::Line {
                file: Some(path.to_owned()),
                line,
                problem,
            },
            other => other,
        })
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
            + self
                .roles
                .keys()
                .filter(|t| !self.grants.contains_key(*t))
                .count()
    }

    /// Whether no token is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets `token` connect to ADS as `role` (one role per token; a later one replaces an
    /// earlier one). In the token file: a word `node=NAME` or `gateway=NAME` on its line.
    pub fn with_xds_role(mut self, token: &str, role: crate::access::XdsRole) -> Self {
        self.roles.insert(token.to_owned(), role);
        self
    }

    /// What `token` may be over ADS, comparing every token in full; `None` for an unknown
    /// token or one without an xDS role.
    pub fn xds_role(&self, token: &str) -> Option<&crate::access::XdsRole> {
        let mut found = None;
        for (known, role) in &self.roles {
            if constant_time_eq(known.as_bytes(), token.as_bytes()) {
                found = Some(role);
            }
        }
        found
    }

    /// Whether `token` is known at all (for the CA, for ADS, or both).
    pub fn knows(&self, token: &str) -> bool {
        self.patterns(token).is_some() || self.xds_role(token).is_some()
    }

    /// What each token grants, never the token: its identities (`spiffe://.../*` for a
    /// prefix) and its xDS role, one JSON object per token, in an order that does not
    /// depend on the tokens.
    pub(crate) fn describe(&self) -> Vec<serde_json::Value> {
        let tokens: BTreeSet<&String> = self.grants.keys().chain(self.roles.keys()).collect();
        let mut entries: Vec<(String, Vec<String>)> = tokens
            .into_iter()
            .map(|token| {
                let role = self.roles.get(token).map(ToString::to_string);
                let identities = self
                    .grants
                    .get(token)
                    .map(|patterns| patterns.iter().map(IdPattern::to_string).collect())
                    .unwrap_or_default();
                (role.unwrap_or_default(), identities)
            })
            .collect();
        entries.sort();
        entries
            .into_iter()
            .map(|(role, identities)| {
                let role = (!role.is_empty()).then_some(role);
                serde_json::json!({ "xds_role": role, "identities": identities })
            })
            .collect()
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

fn parse_pattern(pattern: &str) -> Result<IdPattern, PatternError> {
    let error = |prefix, source| PatternError {
        pattern: pattern.to_owned(),
        prefix,
        source,
    };
    if let Some(prefix) = pattern.strip_suffix("/*") {
        // The prefix itself must be a valid ID, so patterns cannot cross trust domains oddly.
        prefix.parse::<SpiffeId>().map_err(|e| error(true, e))?;
        return Ok(IdPattern::Prefix(format!("{prefix}/")));
    }
    pattern
        .parse::<SpiffeId>()
        .map(IdPattern::Exact)
        .map_err(|e| error(false, e))
}

impl std::fmt::Display for IdPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(id) => write!(f, "{id}"),
            Self::Prefix(prefix) => write!(f, "{prefix}*"),
        }
    }
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
            auth: Authenticator {
                grants: watch::channel(Arc::new(grants)).1,
                accounts: None,
            },
            max_csr_bytes: CaLimits::default().max_csr_bytes,
            metrics: CaMetrics::default(),
            nodes: watch::channel(Arc::new(NodeIdentities::new())).1,
        }
    }

    /// Takes the grants `grants` holds at each call instead of fixed ones (the control plane
    /// follows its token file with it: [`crate::ControlPlaneConfig::tokens_file`]).
    pub fn with_grants(mut self, grants: watch::Receiver<Arc<TokenGrants>>) -> Self {
        self.auth.grants = grants;
        self
    }

    /// Decides `ImpersonatedIdentity` requests by the workloads on each node as `nodes` says
    /// now (the control plane updates it with every manifest load). Without it, no node has
    /// workloads and every such request is refused.
    pub fn with_node_identities(mut self, nodes: watch::Receiver<Arc<NodeIdentities>>) -> Self {
        self.nodes = nodes;
        self
    }

    /// Counts every decision in `metrics` (the `citadel_server_*` and
    /// `meshkit_ca_requests_refused` families of [`crate::metrics`]); the service of
    /// [`CaLimits::service`] counts its refusals there too.
    pub fn with_metrics(mut self, metrics: CaMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Refuses CSRs longer than `bytes` (PEM) with `INVALID_ARGUMENT`, before parsing them
    /// (default [`CaLimits::max_csr_bytes`], 16 KiB).
    pub fn with_max_csr_bytes(mut self, bytes: usize) -> Self {
        self.max_csr_bytes = bytes;
        self
    }

    /// The root certificate as PEM.
    pub fn root_pem(&self) -> String {
        self.ca.root_pem()
    }

    /// Checks ServiceAccount tokens (tokens that are not in the token file) with `reviewer`.
    pub(crate) fn with_service_accounts(mut self, reviewer: Arc<Reviewer>) -> Self {
        self.auth.accounts = Some(reviewer);
        self
    }

    /// The whole decision, without gRPC plumbing: the caller from `authorization`, identity
    /// from the CSR, grant check, signature; counted in the signer's metrics.
    async fn decide(
        &self,
        authorization: Option<&str>,
        request: &IstioCertificateRequest,
    ) -> Result<IstioCertificateResponse, Status> {
        self.metrics.csr();
        // One version of the grants decides the whole call.
        let grants = Arc::clone(&self.auth.grants.borrow());
        let result = match self.auth.authenticate(&grants, authorization).await {
            Ok(credential) => self.try_decide(&grants, &credential, request),
            Err(refused) => Err(refused),
        };
        match result {
            Ok(response) => {
                self.metrics.issued();
                Ok(response)
            }
            Err((reason, status)) => {
                self.metrics.refused(reason);
                Err(status)
            }
        }
    }

    fn try_decide(
        &self,
        grants: &TokenGrants,
        credential: &Credential<'_>,
        request: &IstioCertificateRequest,
    ) -> Result<IstioCertificateResponse, (CaRefusal, Status)> {
        if request.csr.len() > self.max_csr_bytes {
            return Err((
                CaRefusal::Limit,
                Status::invalid_argument(format!(
                    "the CSR is {} bytes, more than the CA's limit of {}",
                    request.csr.len(),
                    self.max_csr_bytes
                )),
            ));
        }
        let id = CaSigner::csr_spiffe_id(&request.csr).map_err(|e| {
            self.metrics.bad_csr(names_no_id(&e));
            (
                CaRefusal::InvalidCsr,
                Status::invalid_argument(ErrorChain(&e).to_string()),
            )
        })?;
        if id.trust_domain() != *self.ca.trust_domain() {
            return Err((
                CaRefusal::PermissionDenied,
                Status::permission_denied(format!(
                    "{id} is not in trust domain {}",
                    self.ca.trust_domain()
                )),
            ));
        }
        // A node proxy's credential obtains the identities of its node's workloads and
        // nothing else, whether or not its request names one (ztunnel in dedicated mode asks
        // for its own workload's identity without naming it): the identities on its token
        // line never count.
        let named = impersonated_identity(request);
        let token = match credential {
            Credential::Bootstrap(token) => token,
            Credential::Account(Caller::Node(node)) => {
                self.check_impersonation(Some(node), &id, named.unwrap_or(Ok(id.as_str())))?;
                return self.sign(request, &id);
            }
            Credential::Account(Caller::Gateway(account) | Caller::Workload(account)) => {
                if named.is_some() {
                    self.check_impersonation(None, &id, named.unwrap_or(Ok(id.as_str())))?;
                }
                let own =
                    SpiffeId::from_istio(self.ca.trust_domain(), &account.namespace, &account.name)
                        .ok();
                if own.as_ref() != Some(&id) {
                    tracing::warn!(%id, %account, "CA: a ServiceAccount asked for another identity");
                    return Err((
                        CaRefusal::PermissionDenied,
                        Status::permission_denied(format!(
                            "ServiceAccount {account} may request only its own identity, not {id}"
                        )),
                    ));
                }
                return self.sign(request, &id);
            }
        };
        let node = match grants.xds_role(token) {
            Some(crate::access::XdsRole::Node(node)) => Some(node.as_str()),
            _ => None,
        };
        if named.is_some() || node.is_some() {
            self.check_impersonation(node, &id, named.unwrap_or(Ok(id.as_str())))?;
            return self.sign(request, &id);
        }
        if !grants.allows(token, &id) {
            tracing::warn!(%id, "CA: token may not request this identity");
            return Err((
                CaRefusal::PermissionDenied,
                Status::permission_denied(format!("this token may not request {id}")),
            ));
        }
        self.sign(request, &id)
    }

    /// Istio's rule for a request naming `ImpersonatedIdentity` (`named`): only a node
    /// proxy's credential (of `node`), only the CSR's own identity, only a workload on its
    /// node.
    fn check_impersonation(
        &self,
        node: Option<&str>,
        id: &SpiffeId,
        named: Result<&str, ()>,
    ) -> Result<(), (CaRefusal, Status)> {
        let named = named.map_err(|()| {
            (
                CaRefusal::InvalidCsr,
                Status::invalid_argument("metadata ImpersonatedIdentity is not a string"),
            )
        })?;
        if named != id.as_str() {
            return Err((
                CaRefusal::PermissionDenied,
                Status::permission_denied(format!(
                    "ImpersonatedIdentity names {named:?}, but the CSR asks for {id}"
                )),
            ));
        }
        let Some(node) = node else {
            tracing::warn!(%id, "CA: impersonation by a credential that is not a node proxy's");
            return Err((
                CaRefusal::PermissionDenied,
                Status::permission_denied(
                    "only a node proxy's credential may request certificates for other identities",
                ),
            ));
        };
        if !self.nodes.borrow().contains(node, id) {
            tracing::warn!(%id, node, "CA: impersonation of an identity not on the caller's node");
            return Err((
                CaRefusal::PermissionDenied,
                Status::permission_denied(format!("no workload on node {node} has identity {id}")),
            ));
        }
        Ok(())
    }

    fn sign(
        &self,
        request: &IstioCertificateRequest,
        id: &SpiffeId,
    ) -> Result<IstioCertificateResponse, (CaRefusal, Status)> {
        let id = id.clone();
        let validity = requested_validity(request, DEFAULT_VALIDITY).min(MAX_VALIDITY);
        let mut chain = self.ca.sign_csr(&request.csr, &id, validity).map_err(|e| {
            tracing::warn!(%id, error = %ErrorChain(&e), "CA: signing failed");
            (
                CaRefusal::SignError,
                Status::invalid_argument(ErrorChain(&e).to_string()),
            )
        })?;
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

/// Whether a CSR error is about its identity (istiod's "ID extraction") rather than its
/// encoding or signature.
fn names_no_id(error: &SignError) -> bool {
    matches!(
        error,
        SignError::CsrSanCount { .. }
            | SignError::CsrSanNotUri
            | SignError::CsrUriNotSpiffeId { .. }
    )
}

// === impl Authenticator ===

impl Authenticator {
    /// The caller: a token of the token file, else a ServiceAccount token the API server
    /// accepts (when ServiceAccount tokens are taken).
    async fn authenticate<'t>(
        &self,
        grants: &TokenGrants,
        authorization: Option<&'t str>,
    ) -> Result<Credential<'t>, (CaRefusal, Status)> {
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                (
                    CaRefusal::Unauthenticated,
                    Status::unauthenticated("a bearer token is required"),
                )
            })?;
        if grants.knows(token) {
            return Ok(Credential::Bootstrap(token));
        }
        match &self.accounts {
            Some(reviewer) if looks_like_jwt(token) => reviewer
                .caller(token)
                .await
                .map(Credential::Account)
                .map_err(|status| {
                    let reason = if status.code() == tonic::Code::Unauthenticated {
                        CaRefusal::Unauthenticated
                    } else {
                        CaRefusal::PermissionDenied
                    };
                    (reason, status)
                }),
            _ => Err((
                CaRefusal::Unauthenticated,
                Status::unauthenticated("unknown bootstrap token"),
            )),
        }
    }

    /// The caller's principal, for its share of the CA's calls: its token, or its node or
    /// ServiceAccount.
    async fn principal(&self, authorization: Option<&str>) -> Result<String, (CaRefusal, Status)> {
        let grants = Arc::clone(&self.grants.borrow());
        Ok(match self.authenticate(&grants, authorization).await? {
            Credential::Bootstrap(token) => format!("token {token}"),
            Credential::Account(Caller::Node(node)) => format!("node {node}"),
            Credential::Account(Caller::Gateway(account) | Caller::Workload(account)) => {
                format!("account {account}")
            }
        })
    }
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("ca", &self.ca)
            .field("grants", &**self.auth.grants.borrow())
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
        Box::pin(async move {
            self.decide(authorization.as_deref(), request.get_ref())
                .await
        })
    }
}

// === limits ===

/// The CA server's bounds, each with a default. [`ControlPlane::start`](crate::ControlPlane::start)
/// applies all of them; a server of one's own applies them with [`CaLimits::service`],
/// [`CaLimits::server`] and [`CaLimits::connections`].
///
/// | setting | default | past it |
/// |---|---|---|
/// | `max_csr_bytes` | 16 KiB of PEM | `INVALID_ARGUMENT`, before the CSR is parsed |
/// | `max_decoding_message_size` | 64 KiB | `OUT_OF_RANGE` (tonic's code), before it is decoded |
/// | `max_encoding_message_size` | 1 MiB | the call fails with `OUT_OF_RANGE` |
/// | `max_concurrent_requests` | 64 calls at once, over all connections | `RESOURCE_EXHAUSTED` at once |
/// | `max_calls_per_source` | 16 of those from one source (an IPv4 address, or an IPv6 /64) | `RESOURCE_EXHAUSTED` at once |
/// | `max_calls_per_caller` | 16 of those for one caller (a token, a node, a ServiceAccount) | `RESOURCE_EXHAUSTED` at once |
/// | `request_timeout` | 10 s per call, from its headers to its answer | `CANCELLED` (tonic's server timeout) |
/// | `max_streams_per_connection` | 16 (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`) | the client waits for a free stream |
/// | `max_connections` | 1,024 | the connection is closed as soon as it is accepted |
/// | `first_call_timeout` | 10 s from the end of the TLS handshake | a connection with no successful call by then is closed |
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CaLimits {
    /// The longest CSR signed, in bytes of PEM. Istio's agents send one or two KiB.
    pub max_csr_bytes: usize,
    /// The largest request message accepted, in bytes.
    pub max_decoding_message_size: usize,
    /// The largest response message sent, in bytes.
    pub max_encoding_message_size: usize,
    /// How many calls may be in progress at once (decoding, signing, answering); one more
    /// is refused with `RESOURCE_EXHAUSTED`, so a flood of slow callers costs a bounded
    /// amount of memory and honest ones are told to retry rather than left waiting.
    pub max_concurrent_requests: usize,
    /// How many of those calls one source (an IPv4 address, or an IPv6 /64) may have in
    /// progress; counted from the call's headers, before its credential is checked, so that
    /// one host cannot hold every place whatever it sends. Applies to the connections of
    /// [`CaLimits::connections`], whose source is known.
    pub max_calls_per_source: usize,
    /// How many of those calls one authenticated caller (a bootstrap token, a node proxy's
    /// node, a ServiceAccount) may have in progress. A call takes a place among
    /// `max_concurrent_requests` only once its credential is accepted, so callers without
    /// one never hold a place.
    pub max_calls_per_caller: usize,
    /// How long one call may take, from its headers to its answer, so a caller that sends
    /// its request slowly holds its place for a bounded time.
    pub request_timeout: Duration,
    /// How many streams (calls) one HTTP/2 connection may have open.
    pub max_streams_per_connection: u32,
    /// How many connections the CA keeps open at once.
    pub max_connections: usize,
    /// How long a connection has to complete its first successful call (a signed
    /// certificate); one that has none by then (silent, or refused only) is closed, so that
    /// clients without a valid token cannot sit on connection slots. Applied by
    /// [`CaLimits::connections`]; [`ConcurrencyLimited`] marks the success.
    pub first_call_timeout: Duration,
}

impl Default for CaLimits {
    fn default() -> Self {
        Self {
            max_csr_bytes: 16 * 1024,
            max_decoding_message_size: 64 * 1024,
            max_encoding_message_size: 1024 * 1024,
            max_concurrent_requests: 64,
            max_calls_per_source: 16,
            max_calls_per_caller: 16,
            request_timeout: Duration::from_secs(10),
            max_streams_per_connection: 16,
            max_connections: 1024,
            first_call_timeout: Duration::from_secs(10),
        }
    }
}

impl CaLimits {
    /// The CA service for `signer` with these limits: the CSR size, the message sizes and
    /// the concurrent calls. Add it to a server from [`CaLimits::server`].
    ///
    /// Each call is admitted in three steps, each refusing with `RESOURCE_EXHAUSTED` or
    /// `UNAUTHENTICATED` at once: its source's share
    /// ([`max_calls_per_source`](Self::max_calls_per_source)), its credential, read from the
    /// headers before the body, and its caller's share
    /// ([`max_calls_per_caller`](Self::max_calls_per_caller)); only then does it take one of
    /// the [`max_concurrent_requests`](Self::max_concurrent_requests) places.
    pub fn service(&self, signer: TokenSigner) -> ConcurrencyLimited<IstioCaServer<TokenSigner>> {
        let metrics = signer.metrics.clone();
        let auth = signer.auth.clone();
        let ca = IstioCaServer::new(signer.with_max_csr_bytes(self.max_csr_bytes))
            .max_decoding_message_size(self.max_decoding_message_size)
            .max_encoding_message_size(self.max_encoding_message_size);
        let mut service = ConcurrencyLimited::new(ca, self.max_concurrent_requests)
            .with_metrics(metrics)
            .with_shares(self.max_calls_per_source, self.max_calls_per_caller);
        service.auth = Some(auth);
        service
    }

    /// The connections of `incoming` as the CA serves them: at most
    /// [`max_connections`](Self::max_connections) open ([`limit_connections`]), each closed
    /// unless its first successful call comes within
    /// [`first_call_timeout`](Self::first_call_timeout) of its arrival here (the service of
    /// [`CaLimits::service`] marks the success). Serve them with [`CaLimits::server`].
    ///
    /// Each connection's source ([`PeerSource`]) goes with its calls, for
    /// [`max_calls_per_source`](Self::max_calls_per_source).
    pub fn connections<I, IO, E>(
        &self,
        incoming: I,
    ) -> impl Stream<Item = Result<Counted<AdmissionDeadline<IO>>, E>> + Send
    where
        I: Stream<Item = Result<IO, E>> + Send,
        IO: PeerSource + Send,
        E: Send,
    {
        let first_call = self.first_call_timeout;
        let deadlined = incoming.map(move |conn| {
            conn.map(|io| {
                let source = io.source().map(meshkit_hbone::fair::source_key);
                (source, AdmissionDeadline::new(io, first_call))
            })
        });
        limit_sourced(deadlined, self.max_connections)
    }

    /// A tonic server builder with the per-connection limits: streams per connection and the
    /// call timeout.
    pub fn server(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.max_streams_per_connection)
            .timeout(self.request_timeout)
    }
}

/// A gRPC service that serves at most a fixed number of calls at once and refuses the rest
/// with `RESOURCE_EXHAUSTED` (made by [`CaLimits::service`]). Clones share the count. A call
/// that succeeds admits its connection's [`Admission`], when it has one (see
/// [`CaLimits::first_call_timeout`]).
#[derive(Clone)]
pub struct ConcurrencyLimited<S> {
    inner: S,
    permits: Arc<Semaphore>,
    max: usize,
    metrics: Option<CaMetrics>,
    /// Places per source and per caller, and the most each may hold.
    sources: Tally<IpAddr>,
    callers: Tally<String>,
    per_source: usize,
    per_caller: usize,
    /// Who a call is, checked before it takes a place ([`CaLimits::service`]).
    auth: Option<Authenticator>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for ConcurrencyLimited<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyLimited")
            .field("inner", &self.inner)
            .field("max", &self.max)
            .field("per_source", &self.per_source)
            .field("per_caller", &self.per_caller)
            .finish_non_exhaustive()
    }
}

impl<S> ConcurrencyLimited<S> {
    /// `inner`, serving at most `max` calls at once, with no share per source or caller.
    pub fn new(inner: S, max: usize) -> Self {
        Self {
            inner,
            permits: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            max,
            metrics: None,
            sources: Tally::default(),
            callers: Tally::default(),
            per_source: usize::MAX,
            per_caller: usize::MAX,
            auth: None,
        }
    }

    /// At most `per_source` calls at once from one source (known for the connections of
    /// [`CaLimits::connections`]) and `per_caller` for one authenticated caller (when the
    /// service checks credentials first, as [`CaLimits::service`]'s does).
    pub fn with_shares(mut self, per_source: usize, per_caller: usize) -> Self {
        self.per_source = per_source.max(1);
        self.per_caller = per_caller.max(1);
        self
    }

    /// Counts the calls refused for the limit in `metrics` (`meshkit_ca_requests_refused`
    /// with `reason="limit"`).
    pub fn with_metrics(mut self, metrics: CaMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

impl<S: NamedService> NamedService for ConcurrencyLimited<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for ConcurrencyLimited<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The clone that was made ready serves this call; a fresh clone stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let this = Gate {
            permits: Arc::clone(&self.permits),
            max: self.max,
            metrics: self.metrics.clone(),
            sources: self.sources.clone(),
            callers: self.callers.clone(),
            per_source: self.per_source,
            per_caller: self.per_caller,
            auth: self.auth.clone(),
        };
        Box::pin(async move {
            let peer = req.extensions().get::<CaPeer<Admission>>().cloned();
            let authorization = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let source = peer.as_ref().and_then(|p| p.source);
            let places = match this.admit(authorization.as_deref(), source).await {
                Ok(places) => places,
                Err(status) => return Ok(status.into_http()),
            };
            let response = inner.call(req).await;
            drop(places);
            // A failed call answers with its status in the headers (trailers-only); a
            // successful one has it in the trailers.
            if let (Some(peer), Ok(response)) = (peer, &response)
                && response
                    .headers()
                    .get("grpc-status")
                    .is_none_or(|code| code == "0")
            {
                peer.info.admit();
            }
            response
        })
    }
}

/// What [`ConcurrencyLimited`] checks a call against, moved into the call's future.
struct Gate {
    permits: Arc<Semaphore>,
    max: usize,
    metrics: Option<CaMetrics>,
    sources: Tally<IpAddr>,
    callers: Tally<String>,
    per_source: usize,
    per_caller: usize,
    auth: Option<Authenticator>,
}

/// The places one call holds until it ends.
struct Places {
    _source: Option<Held<IpAddr>>,
    _caller: Option<Held<String>>,
    _permit: OwnedSemaphorePermit,
}

impl Gate {
    /// The call's places, taken in order: its source's share, its credential, its caller's
    /// share, one of the global permits; or the status that refuses it.
    async fn admit(
        &self,
        authorization: Option<&str>,
        source: Option<IpAddr>,
    ) -> Result<Places, Status> {
        let source = match source {
            Some(ip) => Some(self.sources.take(ip, self.per_source).ok_or_else(|| {
                tracing::warn!(source = %ip, max = self.per_source, "CA call refused: its source has its share in progress");
                self.refused(format!(
                    "this source has its share of {} CA calls in progress; retry later",
                    self.per_source
                ))
            })?),
            None => None,
        };
        let caller = match &self.auth {
            Some(auth) => {
                let principal =
                    auth.principal(authorization)
                        .await
                        .map_err(|(reason, status)| {
                            // Counted as the signer counts a call it refuses (istiod counts
                            // every CSR call that reaches authentication).
                            if let Some(metrics) = &self.metrics {
                                metrics.csr();
                                metrics.refused(reason);
                            }
                            status
                        })?;
                Some(
                    self.callers
                        .take(principal, self.per_caller)
                        .ok_or_else(|| {
                            tracing::warn!(
                                max = self.per_caller,
                                "CA call refused: its caller has its share in progress"
                            );
                            self.refused(format!(
                                "this caller has its share of {} CA calls in progress; retry later",
                                self.per_caller
                            ))
                        })?,
                )
            }
            None => None,
        };
        let permit = Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            tracing::warn!(max = self.max, "CA call refused: too many in progress");
            self.refused(format!(
                "the CA has its limit of {} calls in progress; retry later",
                self.max
            ))
        })?;
        Ok(Places {
            _source: source,
            _caller: caller,
            _permit: permit,
        })
    }

    fn refused(&self, message: String) -> Status {
        if let Some(metrics) = &self.metrics {
            metrics.refused(CaRefusal::Limit);
        }
        Status::resource_exhausted(message)
    }
}

/// What a connection's peer is before any call: its address, for
/// [`CaLimits::max_calls_per_source`].
pub trait PeerSource {
    /// The peer's address, when known.
    fn source(&self) -> Option<IpAddr>;
}

impl PeerSource for tokio::net::TcpStream {
    fn source(&self) -> Option<IpAddr> {
        self.peer_addr().ok().map(|a| a.ip())
    }
}

/// The connection information of a [`Counted`] connection, in each of its calls' request
/// extensions: its inner connection's, and its source when known.
#[derive(Debug, Clone)]
pub struct CaPeer<T> {
    /// The inner connection's information ([`Admission`] for [`CaLimits::connections`]).
    pub info: T,
    /// The peer's source (an IPv4 address, or an IPv6 /64).
    pub source: Option<IpAddr>,
}

/// The connections of `incoming`, at most `max` open at once: one beyond that is dropped
/// (closed) as soon as it arrives, and the stream goes on with the next. Each connection
/// gives its place back when it closes.
pub fn limit_connections<I, IO, E>(
    incoming: I,
    max: usize,
) -> impl Stream<Item = Result<Counted<IO>, E>> + Send
where
    I: Stream<Item = Result<IO, E>> + Send,
    IO: Send,
    E: Send,
{
    limit_sourced(incoming.map(|conn| conn.map(|io| (None, io))), max)
}

/// [`limit_connections`] over connections whose source is known.
fn limit_sourced<I, IO, E>(
    incoming: I,
    max: usize,
) -> impl Stream<Item = Result<Counted<IO>, E>> + Send
where
    I: Stream<Item = Result<(Option<IpAddr>, IO), E>> + Send,
    IO: Send,
    E: Send,
{
    let permits = Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS)));
    incoming.filter_map(move |conn| match conn {
        Ok((source, io)) => match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => Some(Ok(Counted {
                io,
                source,
                _permit: permit,
            })),
            Err(_) => {
                tracing::warn!(max, "CA connection closed: too many open connections");
                None
            }
        },
        Err(e) => Some(Err(e)),
    })
}

/// A connection holding its place among [`limit_connections`]'s `max` until it is dropped.
#[derive(Debug)]
pub struct Counted<IO> {
    io: IO,
    source: Option<IpAddr>,
    _permit: OwnedSemaphorePermit,
}

impl<IO: Connected> Connected for Counted<IO> {
    type ConnectInfo = CaPeer<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        CaPeer {
            info: self.io.connect_info(),
            source: self.source,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_error_names_the_file_the_line_and_the_problem() {
        let chain = |text: &str| {
            let e = TokenGrants::parse(text).unwrap_err();
            ErrorChain(&e).to_string()
        };
        let e = chain("ok spiffe://cluster.local/ns/a/sa/b\nbad spiffe://UPPER/ns/a\n");
        assert!(
            e.starts_with("line 2: \"spiffe://UPPER/ns/a\" is not a SPIFFE ID"),
            "{e}"
        );
        assert_eq!(chain("lonely\n"), "line 1: token without identities");
        let e = chain("t gateway=gw:\n");
        assert_eq!(e, "line 1: \"gateway=gw:\": expected gateway=NAME:CLASS");
        assert!(matches!(
            TokenGrants::parse("t spiffe://a/*x/*").unwrap_err(),
            CaConfigError::Line {
                line: 1,
                problem: LineProblem::Pattern(PatternError { prefix: true, .. }),
                ..
            }
        ));
        let missing = std::path::Path::new("/nonexistent/tokens");
        let e = TokenGrants::load(missing).unwrap_err();
        assert!(matches!(e, CaConfigError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("/nonexistent/tokens"));
    }
    use meshkit_identity::TrustDomain;
    use meshkit_identity::istio::IMPERSONATED_IDENTITY;

    fn signer() -> TokenSigner {
        let td = TrustDomain::new("cluster.local").unwrap();
        let grants = TokenGrants::parse("node-token node=node-a\n").unwrap();
        let mut nodes = NodeIdentities::new();
        nodes.insert("node-a", SpiffeId::from_istio(&td, "shop", "web").unwrap());
        let (_tx, rx) = watch::channel(Arc::new(nodes));
        TokenSigner::new(CaSigner::generate(td).unwrap(), grants).with_node_identities(rx)
    }

    fn request(csr_for: &str, named: prost_types::value::Kind) -> IstioCertificateRequest {
        let id: SpiffeId = csr_for.parse().unwrap();
        let (csr, _key) = meshkit_identity::generate_csr(&id).unwrap();
        IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: Some(prost_types::Struct {
                fields: [(
                    IMPERSONATED_IDENTITY.to_owned(),
                    prost_types::Value { kind: Some(named) },
                )]
                .into(),
            }),
        }
    }

    #[tokio::test]
    async fn the_impersonated_identity_must_be_the_csrs_and_a_string() {
        use prost_types::value::Kind;
        let signer = signer();
        let web = "spiffe://cluster.local/ns/shop/sa/web";
        let ok = request(web, Kind::StringValue(web.to_owned()));
        let issued = signer.decide(Some("Bearer node-token"), &ok).await;
        assert!(issued.is_ok(), "{issued:?}");
        let other = request(
            web,
            Kind::StringValue("spiffe://cluster.local/ns/shop/sa/api".into()),
        );
        let status = signer
            .decide(Some("Bearer node-token"), &other)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert!(
            status.message().contains("but the CSR asks for"),
            "{status}"
        );
        let number = request(web, Kind::NumberValue(1.0));
        let status = signer
            .decide(Some("Bearer node-token"), &number)
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
    }
}
