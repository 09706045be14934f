//! Kubernetes ServiceAccount tokens as the callers' credentials, as istiod takes them.
//!
//! A caller of ADS or the CA sends its ServiceAccount token (a projected token with the
//! audience [`ServiceAccountAuth::audience`], `istio-ca` by default) as its bearer token. The
//! control plane asks the API server whether it is valid with a `TokenReview` naming that
//! audience; the answer names the token's namespace and ServiceAccount, and for a token bound
//! to a Pod, that Pod's name and uid. The control plane finds the Pod (with that uid) among
//! those it watches, and so the node it runs on.
//!
//! | caller | CA | ADS |
//! |---|---|---|
//! | a node proxy: a ServiceAccount of [`ServiceAccountAuth::node_accounts`] (istiod's `CA_TRUSTED_NODE_ACCOUNTS`), token bound to its Pod | the identities of the workloads on its Pod's node, named as `ImpersonatedIdentity` | the node proxy role of its Pod's node ([`XdsRole::Node`]): the workloads of that node and every Service, every policy |
//! | a gateway: a ServiceAccount of [`ServiceAccountAuth::gateway_accounts`] | its own identity | the gateway role ([`XdsRole::Gateway`]), any node id |
//! | any other ServiceAccount | its own identity, `spiffe://TD/ns/NS/sa/NAME`, only | `PERMISSION_DENIED` |
//!
//! A token the API server does not accept (expired, of another audience, of a deleted Pod or
//! ServiceAccount, or not a token at all) is `UNAUTHENTICATED`; a node proxy's token that is
//! not bound to a Pod, or whose Pod is not (yet) known, cannot act for a node.
//!
//! A token whose own claims (read unverified) name another audience or an expiry in the past
//! is refused without a review. Reviews are cached by the SHA-256 of the token: an accepted
//! token until it expires (its `exp` claim), at most an hour; a refused one for 5 seconds,
//! so a caller retrying with a bad token costs the API server one review per 5 s. The cache
//! holds at most [`ServiceAccountAuth::cache_capacity`] tokens (the first to expire goes
//! first); at most [`ServiceAccountAuth::max_concurrent_reviews`] reviews are in flight and
//! 64 more calls wait for one, and further calls are `RESOURCE_EXHAUSTED`. A Pod-bound token
//! stops being good as soon as its Pod is gone, whatever the cache holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest as _, Sha256};
use tokio::sync::{Semaphore, watch};
use tonic::Status;

use crate::access::XdsRole;
use crate::ca::NodeIdentities;
use crate::metrics::ServiceAccountMetrics;

/// Istio's audience for tokens sent to istiod.
pub const ISTIO_CA_AUDIENCE: &str = "istio-ca";

/// The longest a review is trusted, whatever the token's lifetime.
const MAX_CACHED: Duration = Duration::from_secs(3600);
/// How long a refusal is remembered.
const REFUSAL_CACHED: Duration = Duration::from_secs(5);
/// How long one TokenReview may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// A ServiceAccount, `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceAccountRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::str::FromStr for ServiceAccountRef {
    type Err = String;

    /// `NAMESPACE/NAME`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("{s:?}: expected NAMESPACE/NAME")),
        }
    }
}

impl std::fmt::Display for ServiceAccountRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// How ServiceAccount tokens are checked, and what each ServiceAccount may be.
#[derive(Clone)]
pub struct ServiceAccountAuth {
    /// The client whose `TokenReview`s check the tokens (it needs `create` on
    /// `authentication.k8s.io/tokenreviews`).
    pub client: kube::Client,
    /// The audience the tokens must have. Default [`ISTIO_CA_AUDIENCE`].
    pub audience: String,
    /// The node proxies' ServiceAccounts. Default `istio-system/ztunnel`.
    pub node_accounts: Vec<ServiceAccountRef>,
    /// The gateways' ServiceAccounts. Default none.
    pub gateway_accounts: Vec<ServiceAccountRef>,
    /// Reviews kept. Default 4,096.
    pub cache_capacity: usize,
    /// Reviews in flight at once. Default 16.
    pub max_concurrent_reviews: usize,
}

impl std::fmt::Debug for ServiceAccountAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountAuth")
            .field("audience", &self.audience)
            .field("node_accounts", &self.node_accounts)
            .field("gateway_accounts", &self.gateway_accounts)
            .field("cache_capacity", &self.cache_capacity)
            .field("max_concurrent_reviews", &self.max_concurrent_reviews)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountAuth {
    /// Reviews through `client`, with the defaults.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            audience: ISTIO_CA_AUDIENCE.to_owned(),
            node_accounts: vec![ServiceAccountRef {
                namespace: "istio-system".to_owned(),
                name: "ztunnel".to_owned(),
            }],
            gateway_accounts: Vec::new(),
            cache_capacity: 4096,
            max_concurrent_reviews: 16,
        }
    }

    /// Sets the node proxies' ServiceAccounts.
    pub fn with_node_accounts(mut self, accounts: Vec<ServiceAccountRef>) -> Self {
        self.node_accounts = accounts;
        self
    }

    /// Sets the gateways' ServiceAccounts.
    pub fn with_gateway_accounts(mut self, accounts: Vec<ServiceAccountRef>) -> Self {
        self.gateway_accounts = accounts;
        self
    }

    /// Sets the audience.
    pub fn with_audience(mut self, audience: impl Into<String>) -> Self {
        self.audience = audience.into();
        self
    }
}

/// What a reviewed token says of its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewed {
    /// The token's ServiceAccount.
    pub account: ServiceAccountRef,
    /// The Pod the token is bound to, as `(name, uid)`.
    pub pod: Option<(String, String)>,
}

/// A caller authenticated by its ServiceAccount token, and what it may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A node proxy of this node.
    Node(String),
    /// A gateway.
    Gateway(ServiceAccountRef),
    /// Any other workload.
    Workload(ServiceAccountRef),
}

impl Caller {
    /// What it may be over ADS.
    pub(crate) fn xds_role(&self) -> Result<XdsRole, Status> {
        match self {
            Self::Node(node) => Ok(XdsRole::Node(node.clone())),
            Self::Gateway(_) => Ok(XdsRole::Gateway("*".to_owned())),
            Self::Workload(account) => Err(Status::permission_denied(format!(
                "ServiceAccount {account} is neither a node proxy's nor a gateway's: it may not use xDS"
            ))),
        }
    }
}

/// Checks ServiceAccount tokens with TokenReview, cached.
pub(crate) struct Reviewer {
    auth: ServiceAccountAuth,
    /// Calls waiting for a review slot.
    waiting: AtomicUsize,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    reviews: Semaphore,
    nodes: watch::Receiver<Arc<NodeIdentities>>,
    metrics: ServiceAccountMetrics,
}

struct Cached {
    result: Result<Reviewed, String>,
    until: Instant,
}

impl Reviewer {
    pub(crate) fn new(
        auth: ServiceAccountAuth,
        nodes: watch::Receiver<Arc<NodeIdentities>>,
        metrics: ServiceAccountMetrics,
    ) -> Self {
        Self {
            reviews: Semaphore::new(auth.max_concurrent_reviews.max(1)),
            waiting: AtomicUsize::new(0),
            auth,
            cache: Mutex::new(HashMap::new()),
            nodes,
            metrics,
        }
    }

    /// Who holds `token`, and what it may be.
    pub(crate) async fn caller(&self, token: &str) -> Result<Caller, Status> {
        let reviewed = self.review(token).await?;
        // A token bound to a Pod is good while that Pod is: once it is gone, whatever the
        // cache holds.
        if let Some((pod, uid)) = &reviewed.pod
            && !self
                .nodes
                .borrow()
                .has_pod(&reviewed.account.namespace, pod, uid)
        {
            return Err(Status::unavailable(format!(
                "Pod {}/{pod} (uid {uid}) is not known",
                reviewed.account.namespace
            )));
        }
        if self.auth.node_accounts.contains(&reviewed.account) {
            let Some((pod, uid)) = &reviewed.pod else {
                return Err(Status::permission_denied(format!(
                    "the node proxy account {} must present a token bound to its Pod",
                    reviewed.account
                )));
            };
            let node = self
                .nodes
                .borrow()
                .node_of_pod(&reviewed.account.namespace, pod, uid)
                .map(str::to_owned);
            return match node {
                Some(node) => Ok(Caller::Node(node)),
                None => Err(Status::unavailable(format!(
                    "Pod {}/{pod} (uid {uid}) is not known, or runs on no node yet",
                    reviewed.account.namespace
                ))),
            };
        }
        if self.auth.gateway_accounts.contains(&reviewed.account) {
            return Ok(Caller::Gateway(reviewed.account));
        }
        Ok(Caller::Workload(reviewed.account))
    }

    /// The review of `token`, from the cache or the API server.
    async fn review(&self, token: &str) -> Result<Reviewed, Status> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(result) = self.cached(&key) {
            return result.map_err(Status::unauthenticated);
        }
        // What the token says of itself, unverified, can still refuse it without asking the
        // API server: another audience, or expired.
        if let Some(why) = unfit(token, &self.auth.audience) {
            return Err(Status::unauthenticated(why));
        }
        // Beyond the reviews in flight, a bounded queue; more callers are turned away.
        let waiting = Waiting::enter(&self.waiting);
        if waiting.count > MAX_WAITING {
            return Err(Status::resource_exhausted(
                "too many ServiceAccount tokens are waiting for review",
            ));
        }
        let _permit = self
            .reviews
            .acquire()
            .await
            .map_err(|_| Status::unavailable("the control plane is stopping"))?;
        drop(waiting);
        // Another call may have reviewed the same token meanwhile.
        if let Some(result) = self.cached(&key) {
            return result.map_err(Status::unauthenticated);
        }
        let review = tokio::time::timeout(REVIEW_TIMEOUT, self.token_review(token)).await;
        let result = match review {
            Ok(Ok(result)) => result,
            Ok(Err(error)) => {
                self.metrics.reviewed("error");
                tracing::warn!(error = %error, "TokenReview failed");
                return Err(Status::unavailable(
                    "the token could not be reviewed by the API server",
                ));
            }
            Err(_) => {
                self.metrics.reviewed("error");
                return Err(Status::unavailable(
                    "the API server's TokenReview timed out",
                ));
            }
        };
        let until = match &result {
            Ok(_) => {
                self.metrics.reviewed("authenticated");
                let lifetime = expiry(token)
                    .and_then(|exp| exp.duration_since(SystemTime::now()).ok())
                    .unwrap_or(Duration::ZERO);
                Instant::now() + lifetime.min(MAX_CACHED)
            }
            Err(why) => {
                self.metrics.reviewed("refused");
                tracing::info!(why = %why, "token refused");
                Instant::now() + REFUSAL_CACHED
            }
        };
        self.remember(key, result.clone(), until);
        result.map_err(Status::unauthenticated)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Result<Reviewed, String>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(key)
            .filter(|c| c.until > Instant::now())
            .map(|c| c.result.clone())
    }

    fn remember(&self, key: [u8; 32], result: Result<Reviewed, String>, until: Instant) {
        if until <= Instant::now() {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= self.auth.cache_capacity.max(1) {
            let now = Instant::now();
            cache.retain(|_, c| c.until > now);
        }
        if cache.len() >= self.auth.cache_capacity.max(1)
            && let Some(first) = cache.iter().min_by_key(|(_, c)| c.until).map(|(k, _)| *k)
        {
            cache.remove(&first);
        }
        cache.insert(key, Cached { result, until });
    }

    /// One TokenReview: the holder, or why the token is refused.
    async fn token_review(&self, token: &str) -> Result<Result<Reviewed, String>, kube::Error> {
        let api: Api<TokenReview> = Api::all(self.auth.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![self.auth.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let answer = api.create(&PostParams::default(), &review).await?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "the API server does not accept the token".to_owned());
            return Ok(Err(format!("invalid token: {why}")));
        }
        if !status
            .audiences
            .iter()
            .flatten()
            .any(|a| *a == self.auth.audience)
        {
            return Ok(Err(format!(
                "the token is not for audience {:?}",
                self.auth.audience
            )));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        let Some(account) = service_account_of(&username) else {
            return Ok(Err(format!("{username:?} is not a ServiceAccount")));
        };
        let extra = user.extra.unwrap_or_default();
        let single = |key: &str| {
            extra
                .get(key)
                .and_then(|v| v.first())
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let pod = single("authentication.kubernetes.io/pod-name")
            .zip(single("authentication.kubernetes.io/pod-uid"));
        Ok(Ok(Reviewed { account, pod }))
    }
}

/// Calls that may wait for a review slot, beyond those in flight.
const MAX_WAITING: usize = 64;

/// One call counted among those waiting, until dropped.
struct Waiting<'a> {
    counter: &'a AtomicUsize,
    count: usize,
}

impl<'a> Waiting<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        let count = counter.fetch_add(1, Ordering::SeqCst) + 1;
        Self { counter, count }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a token's own claims (read without checking its signature) already rule it out: an
/// `aud` without `audience`, an `exp` in the past. `None` when they do not (or cannot be
/// read: the API server decides).
fn unfit(token: &str, audience: &str) -> Option<String> {
    let claims = claims(token)?;
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(serde_json::Value::String(a)) => vec![a.as_str()],
        Some(serde_json::Value::Array(list)) => list.iter().filter_map(|a| a.as_str()).collect(),
        _ => Vec::new(),
    };
    if claims.get("aud").is_some() && !audiences.contains(&audience) {
        return Some(format!("the token is not for audience {audience:?}"));
    }
    let expired = expiry_of(&claims).is_some_and(|exp| exp <= SystemTime::now());
    expired.then(|| "the token has expired".to_owned())
}

/// `system:serviceaccount:NAMESPACE:NAME`.
fn service_account_of(username: &str) -> Option<ServiceAccountRef> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (namespace, name) = rest.split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then(|| ServiceAccountRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

/// The claims of a JWT, read without checking the signature (the API server checks it).
fn claims(token: &str) -> Option<serde_json::Value> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The `exp` claim of a JWT's `claims`.
fn expiry_of(claims: &serde_json::Value) -> Option<SystemTime> {
    let exp = claims.get("exp")?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

/// The `exp` claim of a JWT, read without checking the signature (the API server did).
fn expiry(token: &str) -> Option<SystemTime> {
    expiry_of(&claims(token)?)
}

/// Whether `token` looks like a JWT (three dot-separated base64url parts), and so may be a
/// ServiceAccount token worth a review.
pub(crate) fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'=')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames_and_tokens_are_read_strictly() {
        assert_eq!(
            service_account_of("system:serviceaccount:istio-system:ztunnel"),
            Some(ServiceAccountRef {
                namespace: "istio-system".into(),
                name: "ztunnel".into()
            })
        );
        assert_eq!(service_account_of("system:serviceaccount:ns"), None);
        assert_eq!(service_account_of("system:serviceaccount:ns:a:b"), None);
        assert_eq!(service_account_of("admin"), None);
        // {"exp":4102444800} (2100-01-01).
        let token = "e30.eyJleHAiOjQxMDI0NDQ4MDB9.c2ln";
        assert!(looks_like_jwt(token));
        assert_eq!(
            expiry(token),
            UNIX_EPOCH.checked_add(Duration::from_secs(4_102_444_800))
        );
        assert!(!looks_like_jwt("node-a-token"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a..c"));
        assert_eq!(expiry("a.!!.c"), None);
        assert!("ns/name".parse::<ServiceAccountRef>().is_ok());
        assert!("ns/".parse::<ServiceAccountRef>().is_err());
        assert!("a/b/c".parse::<ServiceAccountRef>().is_err());
    }
}
