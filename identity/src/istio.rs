//! Istio's CA protocol: `istio.v1.auth.IstioCertificateService/CreateCertificate` over gRPC.
//!
//! [`IstioCaClient`] is a [`CaClient`] for an istiod-compatible CA (or meshkit's own control
//! plane); [`IstioCaServer`] serves the same protocol from any [`CertificateSigner`], so a
//! control plane can be one without generated code.
//!
//! The messages carry the fields meshkit uses, with upstream field numbers: a PEM CSR (1), the
//! validity in seconds (3) and the `metadata` struct (4) in the request; the PEM chain, leaf
//! first, in the response (1). A node proxy that requests certificates for the workloads it
//! carries names each one in `metadata` as `ImpersonatedIdentity`
//! ([`IstioCaClient::with_impersonated_identity`], [`impersonated_identity`]), as ztunnel does.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use tonic::codegen::{Context, Poll, Service, http};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::server::NamedService;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use crate::ca::{CaClient, CaError, CertificateRequest};
use crate::select::BoxFuture;
use crate::svid::certs_from_pem;

/// gRPC path of `CreateCertificate`.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";

/// `istio.v1.auth.IstioCertificateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    /// PEM-encoded PKCS#10 certificate signing request.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested validity, in seconds.
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// Extra request data (`google.protobuf.Struct`); Istio reads `ImpersonatedIdentity`.
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<prost_types::Struct>,
}

/// The `metadata` key under which a node proxy names the identity it requests a certificate
/// for on a workload's behalf.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// The identity `request` names as `ImpersonatedIdentity` in its metadata: `None` when it
/// names none, `Some(Err(()))` when the value is not a string.
pub fn impersonated_identity(request: &IstioCertificateRequest) -> Option<Result<&str, ()>> {
    let value = request
        .metadata
        .as_ref()?
        .fields
        .get(IMPERSONATED_IDENTITY)?;
    Some(match &value.kind {
        Some(prost_types::value::Kind::StringValue(s)) => Ok(s.as_str()),
        _ => Err(()),
    })
}

/// `istio.v1.auth.IstioCertificateResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct IstioCertificateResponse {
    /// PEM certificates, leaf first, root last.
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}

/// A client of an Istio-protocol CA over a tonic [`Channel`] (plaintext or TLS, as the channel
/// was built).
///
/// The caller proves which identities it may request with a bearer token, sent as
/// `authorization: Bearer TOKEN` (Kubernetes service account tokens, in Istio).
#[derive(Debug, Clone)]
pub struct IstioCaClient {
    channel: Channel,
    token: Option<BearerToken>,
    cluster_id: Option<AsciiMetadataValue>,
    timeout: Duration,
    impersonate: bool,
}

/// Where the bearer token comes from.
#[derive(Debug, Clone)]
enum BearerToken {
    /// This header value.
    Fixed(AsciiMetadataValue),
    /// The contents of this file, read for every request.
    File(std::path::PathBuf),
}

/// How long one `CreateCertificate` call may take, connecting included, unless
/// [`IstioCaClient::with_timeout`] says otherwise.
pub const DEFAULT_CA_TIMEOUT: Duration = Duration::from_secs(10);

impl IstioCaClient {
    /// A client over `channel`, without credentials.
    pub fn new(channel: Channel) -> Self {
        Self {
            channel,
            token: None,
            cluster_id: None,
            timeout: DEFAULT_CA_TIMEOUT,
            impersonate: false,
        }
    }

    /// Names the requested identity as `ImpersonatedIdentity` in every request's metadata:
    /// for a node proxy, whose credential is its own and which requests certificates for the
    /// workloads on its node.
    pub fn with_impersonated_identity(mut self, impersonate: bool) -> Self {
        self.impersonate = impersonate;
        self
    }

    /// Bounds each call, connecting included (default [`DEFAULT_CA_TIMEOUT`]). A CA that
    /// accepts and never answers then costs a retry with backoff (the call fails with
    /// [`CaError::Unavailable`]) instead of holding the request, and whoever waits on it,
    /// for ever. The bound is also sent as the call's gRPC deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends `authorization: Bearer TOKEN` with every request.
    ///
    /// # Errors
    ///
    /// [`CaError::Csr`] when the token is not a valid header value.
    pub fn with_bearer_token(mut self, token: &str) -> Result<Self, CaError> {
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| CaError::Csr("bearer token is not a valid header value".into()))?;
        self.token = Some(BearerToken::Fixed(value));
        Ok(self)
    }

    /// Sends `authorization: Bearer TOKEN` with every request, `TOKEN` read from `path`
    /// for each (surrounding white space trimmed): a projected ServiceAccount token, which
    /// the kubelet rewrites before it expires, is sent as it is now. A request whose file
    /// cannot be read, or holds no valid header value, fails with [`CaError::Unavailable`]
    /// and is retried as for an unreachable CA.
    pub fn with_bearer_token_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.token = Some(BearerToken::File(path.into()));
        self
    }

    /// Sends the `ClusterID` header Istio uses to pick the cluster that authenticates the token.
    ///
    /// # Errors
    ///
    /// [`CaError::Csr`] when the value is not a valid header value.
    pub fn with_cluster_id(mut self, cluster_id: &str) -> Result<Self, CaError> {
        let value = MetadataValue::try_from(cluster_id)
            .map_err(|_| CaError::Csr("cluster id is not a valid header value".into()))?;
        self.cluster_id = Some(value);
        Ok(self)
    }

    async fn create(
        &self,
        request: &CertificateRequest,
    ) -> Result<Vec<CertificateDer<'static>>, CaError> {
        tokio::time::timeout(self.timeout, self.call(request))
            .await
            .map_err(|_| CaError::Unavailable(format!("no answer within {:?}", self.timeout)))?
    }

    async fn call(
        &self,
        request: &CertificateRequest,
    ) -> Result<Vec<CertificateDer<'static>>, CaError> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready()
            .await
            .map_err(|e| CaError::Unavailable(e.to_string()))?;
        let metadata = self.impersonate.then(|| prost_types::Struct {
            fields: [(
                IMPERSONATED_IDENTITY.to_owned(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(
                        request.id.to_string(),
                    )),
                },
            )]
            .into(),
        });
        let mut req = tonic::Request::new(IstioCertificateRequest {
            csr: request.csr_pem.clone(),
            validity_duration: i64::try_from(request.validity.as_secs()).unwrap_or(i64::MAX),
            metadata,
        });
        req.set_timeout(self.timeout);
        match &self.token {
            Some(BearerToken::Fixed(token)) => {
                req.metadata_mut().insert("authorization", token.clone());
            }
            Some(BearerToken::File(path)) => {
                let token = std::fs::read_to_string(path).map_err(|e| {
                    CaError::Unavailable(format!(
                        "cannot read the token file {}: {e}",
                        path.display()
                    ))
                })?;
                let value =
                    MetadataValue::try_from(format!("Bearer {}", token.trim())).map_err(|_| {
                        CaError::Unavailable(format!(
                            "the token file {} holds no valid token",
                            path.display()
                        ))
                    })?;
                req.metadata_mut().insert("authorization", value);
            }
            None => {}
        }
        if let Some(cluster) = &self.cluster_id {
            req.metadata_mut().insert("clusterid", cluster.clone());
        }
        let path = http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE_PATH);
        let response: tonic::Response<IstioCertificateResponse> = grpc
            .unary(req, path, ProstCodec::default())
            .await
            .map_err(status_to_error)?;
        let mut chain = Vec::new();
        for pem in &response.get_ref().cert_chain {
            chain.extend(certs_from_pem(pem).map_err(CaError::InvalidSvid)?);
        }
        Ok(chain)
    }
}

fn status_to_error(status: Status) -> CaError {
    let message = format!("{:?}: {}", status.code(), status.message());
    match status.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Internal
        | Code::Unknown
        | Code::Cancelled => CaError::Unavailable(message),
        _ => CaError::Rejected(message),
    }
}

impl CaClient for IstioCaClient {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        Box::pin(self.create(request))
    }
}

/// What an Istio-protocol CA server does with a request: authenticate the caller (from the
/// request metadata), check that the CSR asks only for identities the caller may hold, and sign.
pub trait CertificateSigner: Send + Sync + 'static {
    /// Answers one `CreateCertificate` call.
    ///
    /// # Errors
    ///
    /// A gRPC status: `Unauthenticated` or `PermissionDenied` for callers that may not have
    /// the identity, `InvalidArgument` for a malformed CSR.
    fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> BoxFuture<'_, Result<IstioCertificateResponse, Status>>;
}

/// A tonic service serving `istio.v1.auth.IstioCertificateService` from a
/// [`CertificateSigner`]; add it to a `tonic::transport::Server` with `add_service`.
#[derive(Debug)]
pub struct IstioCaServer<S> {
    signer: Arc<S>,
    max_decoding_message_size: usize,
    max_encoding_message_size: usize,
}

impl<S> IstioCaServer<S> {
    /// Serves `signer`, accepting requests of up to 64 KiB and sending responses of up to
    /// 1 MiB (see the `max_*_message_size` methods).
    pub fn new(signer: S) -> Self {
        Self {
            signer: Arc::new(signer),
            max_decoding_message_size: 64 * 1024,
            max_encoding_message_size: 1024 * 1024,
        }
    }

    /// The largest request accepted, in bytes (default 64 KiB: a CSR is one or two KiB); a
    /// larger one is refused with `OUT_OF_RANGE` before it is decoded.
    pub fn max_decoding_message_size(mut self, bytes: usize) -> Self {
        self.max_decoding_message_size = bytes;
        self
    }

    /// The largest response sent, in bytes (default 1 MiB: a chain of a few certificates);
    /// a larger one fails the call with `OUT_OF_RANGE`.
    pub fn max_encoding_message_size(mut self, bytes: usize) -> Self {
        self.max_encoding_message_size = bytes;
        self
    }
}

impl<S> Clone for IstioCaServer<S> {
    fn clone(&self) -> Self {
        Self {
            signer: self.signer.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
            max_encoding_message_size: self.max_encoding_message_size,
        }
    }
}

impl<S> NamedService for IstioCaServer<S> {
    const NAME: &'static str = "istio.v1.auth.IstioCertificateService";
}

impl<S, B> Service<http::Request<B>> for IstioCaServer<S>
where
    S: CertificateSigner,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != CREATE_CERTIFICATE_PATH {
            let status = Status::unimplemented(format!("no method {}", req.uri().path()));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let signer = Unary(self.signer.clone());
        let limits = (
            Some(self.max_decoding_message_size),
            Some(self.max_encoding_message_size),
        );
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default())
                .apply_max_message_size_config(limits.0, limits.1);
            Ok(grpc.unary(signer, req).await)
        })
    }
}

struct Unary<S>(Arc<S>);

impl<S: CertificateSigner> tonic::server::UnaryService<IstioCertificateRequest> for Unary<S> {
    type Response = IstioCertificateResponse;
    type Future = BoxFuture<'static, Result<tonic::Response<IstioCertificateResponse>, Status>>;

    fn call(&mut self, request: tonic::Request<IstioCertificateRequest>) -> Self::Future {
        let signer = self.0.clone();
        Box::pin(async move {
            signer
                .create_certificate(request)
                .await
                .map(tonic::Response::new)
        })
    }
}

/// The validity asked for in a request, or `default` when it is absent or not positive.
pub fn requested_validity(request: &IstioCertificateRequest, default: Duration) -> Duration {
    u64::try_from(request.validity_duration)
        .ok()
        .filter(|&secs| secs > 0)
        .map_or(default, Duration::from_secs)
}
