//! The gateway's request path as a tower stack. Each step is a [`Layer`] and reads what the
//! steps before it found from the request's extensions, so a filter is one more layer, not an
//! edit in the middle of a handler:
//!
//! ```text
//! RouteLayer    port + host + path -> the backend: a Gateway API rule on a port of a
//!               served Gateway, else the Ingress route    400 no host (or two), 404 no route,
//!                                                         30x redirect, 500 invalid backend
//! RequestHeadersLayer  the rule's RequestHeaderModifier and URLRewrite (Gateway API)
//! ResponseHeadersLayer the rule's ResponseHeaderModifier, on the answer (Gateway API)
//! ResolveLayer  backend -> the service's endpoints         503 unknown service, port, endpoints
//!               (Route, RequestHeaders and Resolve are FilterLayers: a RequestFilter passes
//!               the request on or answers)
//! RewriteLayer  hop-by-hop headers out, X-Forwarded-* in;  the answer in the client's version
//! Forward       endpoint by endpoint: a pooled backend connection or a new HBONE tunnel
//! ```
//!
//! Every step answers errors itself (a short plain-text response with the status above) and
//! never fails as a `Service`: the stack's error type is [`Infallible`]. Each answer also
//! carries, in a private response extension, how it was served (configuration, route,
//! endpoint, and the response flag of a failure: `DPE`, `NR`, `NC`, `UH`, `UF`, `UC`, `UPE`,
//! `UT`), which the listener reads for the request's metrics and access-log line. `Forward`
//! puts the request's `traceparent` (the listener's, naming the gateway's span) on the
//! CONNECT of every tunnel it opens.
//!
//! A new filter is a [`RequestFilter`] (or any `Layer` when it must see the response too),
//! added as one more `.layer(..)` in the stack's builder between the steps whose results it
//! needs; it reads the [`Client`], [`RouteTarget`] and [`ResolvedBackends`] extensions that
//! the earlier steps leave.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use meshkit_hbone::Target;
use meshkit_ingress_model::gateway::{Action, Filter, HttpRequest};
use meshkit_mesh::Endpoint;
use tower::Layer;
use tower_service::Service;

use crate::observe::{self, Flag, Served};
use crate::proxy::{self, Body, Exchange, error};
use crate::trace::TRACEPARENT;
use crate::{Compiled, Shared};

/// The future of the last step, [`Forward`].
pub type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// The client connection a request came on (inserted by the listener, before the stack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    /// The client's address.
    pub addr: SocketAddr,
    /// The local port the connection arrived on.
    pub port: u16,
    /// Whether the connection came on a Gateway API listener
    /// ([`Gateway::serve_gateway_api`](crate::Gateway::serve_gateway_api)): routed by the
    /// Gateway API rules of its port, never by the Ingresses.
    pub gateway_api: bool,
    /// `http` or `https`.
    pub scheme: &'static str,
    /// Whether the client is one of the gateway's trusted proxies
    /// ([`GatewaySettings::trusted_proxies`](crate::GatewaySettings::trusted_proxies)): its
    /// `X-Forwarded-For` and `Forwarded` are kept.
    pub trusted_proxy: bool,
}

/// What [`RouteLayer`] found: the request's host and the backend its route names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTarget {
    /// The request's host (`:authority` or `Host`), port included if the client sent one.
    pub host: String,
    /// The namespace of the Ingress that matched (its backend service is in it).
    pub namespace: String,
    /// The backend service's name.
    pub service: String,
    /// The backend port by number, if the Ingress numbers it.
    pub port_number: Option<u16>,
    /// The backend port by name, if the Ingress names it.
    pub port_name: Option<String>,
}

/// What [`ResolveLayer`] found: the endpoints to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedBackends {
    /// The service's endpoints for the routed port, starting with this request's turn of
    /// the round robin.
    pub endpoints: Vec<Endpoint>,
}

/// The configuration a request is served with, taken once by [`RouteLayer`] so that every
/// later step sees the same one even if a new one arrives meanwhile, and the key of the
/// route it matched there (for the request's metrics).
#[derive(Clone)]
struct Config {
    compiled: Arc<Compiled>,
    route: usize,
}

/// The filters of the Gateway API rule (and backend) a request matched, left by
/// [`RouteLayer`] for the layers that apply them.
#[derive(Debug, Clone)]
pub struct RuleFilters {
    /// The rule's filters, then the chosen backend's, in order.
    pub filters: Vec<Filter>,
    /// The path value the rule matched (what `ReplacePrefixMatch` replaces).
    pub matched_path: String,
}

/// Builds the gateway's stack over `shared`.
pub(crate) fn build(shared: Arc<Shared>) -> Stack {
    tower::ServiceBuilder::new()
        .layer(FilterLayer::new(Route {
            shared: shared.clone(),
        }))
        // Gateway API filters: a change to the request before it is resolved and rewritten
        // for the backend, and one to the answer on its way back.
        .layer(FilterLayer::new(RequestHeaders))
        .layer(ResponseHeadersLayer)
        .layer(FilterLayer::new(Resolve {
            shared: shared.clone(),
        }))
        .layer(RewriteLayer)
        .service(Forward { shared })
}

/// The assembled stack.
pub(crate) type Stack =
    Filtered<Route, Filtered<RequestHeaders, ResponseHeaders<Filtered<Resolve, Rewrite<Forward>>>>>;

// === filters ===

/// A step that looks at a request before the next one does: it annotates the request (its
/// extensions, its headers) and passes it on, or answers it itself. Routing and resolving are
/// filters; so is any check that needs nothing of the response.
pub trait RequestFilter: Clone + Send + Sync + 'static {
    /// Whether the request goes on, or what it is answered with instead.
    fn filter(&self, req: &mut Request<Incoming>) -> Verdict;
}

/// What a [`RequestFilter`] decided.
#[derive(Debug)]
pub enum Verdict {
    /// The request goes on to the next step.
    Pass,
    /// The request goes no further; this is the answer.
    Answer(Response<Body>),
}

impl From<Result<(), Response<Body>>> for Verdict {
    fn from(result: Result<(), Response<Body>>) -> Self {
        match result {
            Ok(()) => Self::Pass,
            Err(answer) => Self::Answer(answer),
        }
    }
}

/// A [`Layer`] that runs a [`RequestFilter`] before the service it wraps.
#[derive(Debug, Clone)]
pub struct FilterLayer<F> {
    filter: F,
}

/// The service of a [`FilterLayer`].
#[derive(Debug, Clone)]
pub struct Filtered<F, S> {
    filter: F,
    inner: S,
}

/// Routes by host and path in the current route table (Kubernetes Ingress semantics).
pub type RouteLayer = FilterLayer<Route>;

/// Resolves the routed backend to its endpoints.
pub type ResolveLayer = FilterLayer<Resolve>;

impl<F> FilterLayer<F> {
    /// A layer running `filter`.
    pub fn new(filter: F) -> Self {
        Self { filter }
    }
}

impl<F: Clone, S> Layer<S> for FilterLayer<F> {
    type Service = Filtered<F, S>;
    fn layer(&self, inner: S) -> Filtered<F, S> {
        Filtered {
            filter: self.filter.clone(),
            inner,
        }
    }
}

impl<F, S> Service<Request<Incoming>> for Filtered<F, S>
where
    F: RequestFilter,
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = FilterFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        match self.filter.filter(&mut req) {
            Verdict::Pass => FilterFuture::Inner(self.inner.call(req)),
            Verdict::Answer(answer) => FilterFuture::Answer(Some(answer)),
        }
    }
}

/// The future of a [`Filtered`] service: the next step's, or the filter's own answer. The
/// steps' futures are plain values, not boxes, so a request through the stack allocates only
/// for the forwarding at its end.
#[derive(Debug)]
pub enum FilterFuture<F> {
    /// The request went on.
    Inner(F),
    /// The filter answered.
    Answer(Option<Response<Body>>),
}

impl<F> Future for FilterFuture<F>
where
    F: Future<Output = Result<Response<Body>, Infallible>> + Unpin,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Inner(inner) => Pin::new(inner).poll(cx),
            Self::Answer(answer) => Poll::Ready(Ok(answer.take().unwrap_or_else(|| {
                error(StatusCode::INTERNAL_SERVER_ERROR, "answer already taken")
            }))),
        }
    }
}

// === route ===

/// The routing step: finds the Ingress backend for the request's host and path, and leaves a
/// [`RouteTarget`] (400 without a host, with an empty one or with more than one `Host`
/// header; 404 without a route or a service backend).
#[derive(Clone)]
pub struct Route {
    shared: Arc<Shared>,
}

impl RequestFilter for Route {
    fn filter(&self, req: &mut Request<Incoming>) -> Verdict {
        self.route(req).into()
    }
}

impl Route {
    #[allow(clippy::result_large_err)] // the answer moves straight into the response
    fn route(&self, req: &mut Request<Incoming>) -> Result<(), Response<Body>> {
        let compiled = self.shared.current.borrow().clone();
        let refuse = |status, message, flag, target: Option<RouteTarget>, route| {
            observe::served(
                error(status, message),
                Served {
                    config: compiled.clone(),
                    target,
                    route,
                    endpoint: None,
                    flag,
                    upload: None,
                },
            )
        };
        // RFC 9112, 3.2: more than one Host line is a 400; which one the client meant is
        // not the gateway's to guess (nor the backend's: it gets one, rewritten).
        if req
            .headers()
            .get_all(http::header::HOST)
            .iter()
            .nth(1)
            .is_some()
        {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "more than one Host header",
                Flag::DownstreamProtocolError,
                None,
                0,
            ));
        }
        // An empty Host names no host: no rule could match it by name.
        let Some(host) = proxy::request_host(req).filter(|host| !host.is_empty()) else {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "no host in the request",
                Flag::DownstreamProtocolError,
                None,
                0,
            ));
        };
        let client = req.extensions().get::<Client>().copied();
        if let Some(client) = client.filter(|c| c.gateway_api) {
            return self.route_gateway_api(req, &compiled, host, client.port, client.scheme);
        }
        let Some(route) = compiled.table.route(&host, req.uri().path()) else {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "no route",
                Flag::NoRoute,
                None,
                0,
            ));
        };
        let key = observe::route_key(&route);
        let Some(backend) = route.backend().service.as_ref() else {
            let target = RouteTarget {
                host,
                namespace: route.namespace().to_owned(),
                service: String::new(),
                port_number: None,
                port_name: None,
            };
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "route has no service backend",
                Flag::NoRoute,
                Some(target),
                key,
            ));
        };
        let target = RouteTarget {
            namespace: route.namespace().to_owned(),
            service: backend.name.clone().unwrap_or_default(),
            port_number: backend
                .port
                .as_ref()
                .and_then(|p| p.number)
                .and_then(|n| u16::try_from(n).ok()),
            port_name: backend.port.as_ref().and_then(|p| p.name.clone()),
            host,
        };
        req.extensions_mut().insert(target);
        req.extensions_mut().insert(Config {
            compiled: compiled.clone(),
            route: key,
        });
        Ok(())
    }
}

impl Route {
    /// Routes by the Gateway API rules of the Gateway listeners on `port`.
    #[allow(clippy::result_large_err)] // the answer moves straight into the response
    fn route_gateway_api(
        &self,
        req: &mut Request<Incoming>,
        compiled: &Arc<Compiled>,
        host: String,
        port: u16,
        scheme: &'static str,
    ) -> Result<(), Response<Body>> {
        let answer = |resp: Response<Body>, flag, key| {
            observe::served(
                resp,
                Served {
                    config: compiled.clone(),
                    target: None,
                    route: key,
                    endpoint: None,
                    flag,
                    upload: None,
                },
            )
        };
        let facts = HttpRequest {
            port,
            host: &host,
            path: req.uri().path(),
            query: req.uri().query(),
            method: req.method().as_str(),
            headers: req.headers(),
        };
        let Some(rule) = compiled.http_routes.route(&facts) else {
            return Err(answer(
                error(StatusCode::NOT_FOUND, "no route"),
                Flag::NoRoute,
                0,
            ));
        };
        let backend = match rule.action(self.shared.next_roll(rule.rule_key())) {
            Action::Redirect(redirect) => {
                let location = redirect.location(
                    scheme,
                    &host,
                    port,
                    req.uri().path(),
                    req.uri().query(),
                    rule.matched_path(),
                );
                let mut resp = error(
                    StatusCode::from_u16(redirect.status()).unwrap_or(StatusCode::FOUND),
                    "redirect",
                );
                if let Ok(value) = http::HeaderValue::from_str(&location) {
                    resp.headers_mut().insert(http::header::LOCATION, value);
                }
                return Err(answer(resp, Flag::None, 0));
            }
            Action::Status(status) => {
                return Err(answer(
                    error(
                        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        "no valid backend for this request",
                    ),
                    Flag::NoCluster,
                    0,
                ));
            }
            Action::Forward(backend) => backend,
        };
        let Ok(service) = backend.target.as_ref() else {
            return Err(answer(
                error(StatusCode::INTERNAL_SERVER_ERROR, "invalid backend"),
                Flag::NoCluster,
                0,
            ));
        };
        let key = std::ptr::from_ref(backend).addr();
        let filters: Vec<Filter> = rule
            .filters()
            .iter()
            .chain(&backend.filters)
            .cloned()
            .collect();
        if !filters.is_empty() {
            req.extensions_mut().insert(RuleFilters {
                filters,
                matched_path: rule.matched_path().to_owned(),
            });
        }
        req.extensions_mut().insert(RouteTarget {
            host,
            namespace: service.namespace.clone(),
            service: service.name.clone(),
            port_number: Some(service.port),
            port_name: None,
        });
        req.extensions_mut().insert(Config {
            compiled: compiled.clone(),
            route: key,
        });
        Ok(())
    }
}

// === Gateway API filters ===

/// Applies a Gateway API rule's `RequestHeaderModifier` and `URLRewrite` (host and path)
/// to the request, before it is resolved and rewritten for the backend.
#[derive(Debug, Clone, Copy)]
pub struct RequestHeaders;

/// The [`RequestHeaders`] step as a layer.
pub type RequestHeadersLayer = FilterLayer<RequestHeaders>;

impl RequestFilter for RequestHeaders {
    fn filter(&self, req: &mut Request<Incoming>) -> Verdict {
        let Some(rule) = req.extensions().get::<RuleFilters>().cloned() else {
            return Verdict::Pass;
        };
        for filter in &rule.filters {
            match filter {
                Filter::RequestHeaders(modifier) => modifier.apply(req.headers_mut()),
                Filter::Rewrite(rewrite) => {
                    if let Some(host) = rewrite.hostname()
                        && let Some(target) = req.extensions_mut().get_mut::<RouteTarget>()
                    {
                        host.clone_into(&mut target.host);
                    }
                    if let Some(path) = rewrite.path(req.uri().path(), &rule.matched_path) {
                        let target = match req.uri().query() {
                            Some(query) => format!("{path}?{query}"),
                            None => path,
                        };
                        let mut parts = req.uri().clone().into_parts();
                        match target.parse() {
                            Ok(pq) => parts.path_and_query = Some(pq),
                            Err(_) => {
                                return Verdict::Answer(refuse_routed(
                                    req,
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                    "the rewritten path is not a valid URI path",
                                    Flag::NoRoute,
                                ));
                            }
                        }
                        if let Ok(uri) = http::Uri::from_parts(parts) {
                            *req.uri_mut() = uri;
                        }
                    }
                }
                _ => {}
            }
        }
        Verdict::Pass
    }
}

/// A [`Layer`] applying a Gateway API rule's `ResponseHeaderModifier` to whatever answers
/// the request after it (a backend's response or a later step's error).
#[derive(Debug, Clone, Copy)]
pub struct ResponseHeadersLayer;

/// The service of [`ResponseHeadersLayer`].
#[derive(Debug, Clone)]
pub struct ResponseHeaders<S> {
    inner: S,
}

impl<S> Layer<S> for ResponseHeadersLayer {
    type Service = ResponseHeaders<S>;
    fn layer(&self, inner: S) -> ResponseHeaders<S> {
        ResponseHeaders { inner }
    }
}

impl<S> Service<Request<Incoming>> for ResponseHeaders<S>
where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseHeadersFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let modifiers: Vec<meshkit_ingress_model::gateway::HeaderModifier> = req
            .extensions()
            .get::<RuleFilters>()
            .map(|rule| {
                rule.filters
                    .iter()
                    .filter_map(|f| match f {
                        Filter::ResponseHeaders(m) => Some(m.clone()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        ResponseHeadersFuture {
            inner: self.inner.call(req),
            modifiers,
        }
    }
}

/// The future of [`ResponseHeaders`].
#[derive(Debug)]
pub struct ResponseHeadersFuture<F> {
    inner: F,
    modifiers: Vec<meshkit_ingress_model::gateway::HeaderModifier>,
}

impl<F> Future for ResponseHeadersFuture<F>
where
    F: Future<Output = Result<Response<Body>, Infallible>> + Unpin,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut resp = match Pin::new(&mut this.inner).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(resp)) => resp,
            Poll::Ready(Err(never)) => match never {},
        };
        for modifier in &this.modifiers {
            modifier.apply(resp.headers_mut());
        }
        Poll::Ready(Ok(resp))
    }
}

/// A refusal after routing, served with the request's configuration and route.
fn refuse_routed(
    req: &mut Request<Incoming>,
    status: StatusCode,
    message: &'static str,
    flag: Flag,
) -> Response<Body> {
    let resp = error(status, message);
    let target = req.extensions_mut().remove::<RouteTarget>();
    match req.extensions_mut().remove::<Config>() {
        Some(Config { compiled, route }) => observe::served(
            resp,
            Served {
                config: compiled,
                target,
                route,
                endpoint: None,
                flag,
                upload: None,
            },
        ),
        None => resp,
    }
}

// === resolve ===

/// The resolving step: the routed backend service's endpoints in the mesh for the routed
/// port, round-robin per service port, as [`ResolvedBackends`] (503 for an unknown service or
/// port, or no endpoints).
#[derive(Clone)]
pub struct Resolve {
    shared: Arc<Shared>,
}

impl RequestFilter for Resolve {
    fn filter(&self, req: &mut Request<Incoming>) -> Verdict {
        self.resolve(req).into()
    }
}

impl Resolve {
    #[allow(clippy::result_large_err)] // the answer moves straight into the response
    fn resolve(&self, req: &mut Request<Incoming>) -> Result<(), Response<Body>> {
        let (Some(target), Some(Config { compiled, .. })) = (
            req.extensions().get::<RouteTarget>(),
            req.extensions().get::<Config>(),
        ) else {
            return Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "request not routed",
            ));
        };
        let Some(service) = compiled.index.service(&target.namespace, &target.service) else {
            tracing::info!(namespace = %target.namespace, service = %target.service, "backend service unknown");
            return Err(refuse_routed(
                req,
                StatusCode::SERVICE_UNAVAILABLE,
                "backend service unknown",
                Flag::NoCluster,
            ));
        };
        let Some(port) = service.port(target.port_number, target.port_name.as_deref()) else {
            return Err(refuse_routed(
                req,
                StatusCode::SERVICE_UNAVAILABLE,
                "backend service has no such port",
                Flag::NoCluster,
            ));
        };
        let mut endpoints = compiled.index.endpoints(service, port);
        if endpoints.is_empty() {
            return Err(refuse_routed(
                req,
                StatusCode::SERVICE_UNAVAILABLE,
                "no endpoints",
                Flag::NoHealthyUpstream,
            ));
        }
        let turn = self
            .shared
            .next_endpoint(&target.namespace, &target.service, port.port);
        let len = endpoints.len();
        endpoints.rotate_left(turn % len);
        req.extensions_mut().insert(ResolvedBackends { endpoints });
        Ok(())
    }
}

// === rewrite ===

/// Rewrites the request for an HTTP/1.1 backend (origin-form target, `Host`, hop-by-hop
/// headers removed, `X-Forwarded-For`, `X-Forwarded-Proto` and `Forwarded` naming the client)
/// and gives the answer back in the client's HTTP version, whatever the backend spoke.
#[derive(Debug, Clone, Copy, Default)]
pub struct RewriteLayer;

/// The [`RewriteLayer`] service.
#[derive(Debug, Clone)]
pub struct Rewrite<S> {
    inner: S,
}

impl<S> Layer<S> for RewriteLayer {
    type Service = Rewrite<S>;
    fn layer(&self, inner: S) -> Rewrite<S> {
        Rewrite { inner }
    }
}

impl<S> Service<Request<Incoming>> for Rewrite<S>
where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = RewriteFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        let version = req.version();
        let (Some(client), Some(target)) = (
            req.extensions().get::<Client>().copied(),
            req.extensions().get::<RouteTarget>(),
        ) else {
            return RewriteFuture {
                inner: FilterFuture::Answer(Some(error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "request not routed",
                ))),
                version,
            };
        };
        let host = target.host.clone();
        proxy::prepare(
            &mut req,
            &host,
            client.addr,
            client.scheme,
            client.trusted_proxy,
        );
        RewriteFuture {
            inner: FilterFuture::Inner(self.inner.call(req)),
            version,
        }
    }
}

/// The future of a [`Rewrite`] service: the next step's answer, in the client's HTTP version.
#[derive(Debug)]
pub struct RewriteFuture<F> {
    inner: FilterFuture<F>,
    version: http::Version,
}

impl<F> Future for RewriteFuture<F>
where
    F: Future<Output = Result<Response<Body>, Infallible>> + Unpin,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut resp = std::task::ready!(Pin::new(&mut this.inner).poll(cx))?;
        *resp.version_mut() = this.version;
        Poll::Ready(Ok(resp))
    }
}

// === forward ===

/// Forwards to the resolved endpoints in turn: an idle pooled connection to the endpoint
/// first, else a new HBONE tunnel presenting the gateway's identity and expecting the
/// endpoint workload's; an endpoint whose tunnel cannot be opened is skipped (503 when none
/// can). A request body is held to [`GatewaySettings::max_request_body_bytes`] (413) and
/// [`GatewaySettings::request_body_timeout`] (408); the backend then has
/// [`GatewaySettings::response_timeout`] to answer (504). With
/// [`GatewaySettings::expose_backend_headers`], the answer names the workload that answered
/// and the identity its end proved.
///
/// [`GatewaySettings::max_request_body_bytes`]: crate::GatewaySettings::max_request_body_bytes
/// [`GatewaySettings::request_body_timeout`]: crate::GatewaySettings::request_body_timeout
/// [`GatewaySettings::response_timeout`]: crate::GatewaySettings::response_timeout
/// [`GatewaySettings::expose_backend_headers`]: crate::GatewaySettings::expose_backend_headers
#[derive(Clone)]
pub struct Forward {
    shared: Arc<Shared>,
}

impl Service<Request<Incoming>> for Forward {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> ResponseFuture {
        let shared = self.shared.clone();
        Box::pin(async move { Ok(forward(&shared, req).await) })
    }
}

/// What became of a request given to the endpoints.
struct Forwarded {
    resp: Response<Body>,
    flag: Flag,
    /// The endpoint that answered, or the last one tried.
    endpoint: Option<SocketAddr>,
}

async fn forward(shared: &Shared, mut req: Request<Incoming>) -> Response<Body> {
    let target = req.extensions_mut().remove::<RouteTarget>();
    let Some(Config { compiled, route }) = req.extensions_mut().remove::<Config>() else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "request not routed");
    };
    let mut upload = None;
    let Forwarded {
        resp,
        flag,
        endpoint,
    } = forward_to_endpoints(shared, req, &mut upload).await;
    observe::served(
        resp,
        Served {
            config: compiled,
            target,
            route,
            endpoint,
            flag,
            upload,
        },
    )
}

async fn forward_to_endpoints(
    shared: &Shared,
    mut req: Request<Incoming>,
    upload: &mut Option<tokio::sync::watch::Receiver<proxy::Progress>>,
) -> Forwarded {
    let refuse = |status, message, flag, endpoint| Forwarded {
        resp: error(status, message),
        flag,
        endpoint,
    };
    let Some(ResolvedBackends { endpoints }) = req.extensions_mut().remove::<ResolvedBackends>()
    else {
        return refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "request not resolved",
            Flag::None,
            None,
        );
    };
    let settings = &shared.settings;
    // A declared length over the limit is refused before any tunnel is opened; a body
    // without one is counted as it streams (RequestBody).
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > settings.max_request_body_bytes) {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
            Flag::None,
            None,
        );
    }
    let mut req = req.map(|body| {
        proxy::RequestBody::new(
            body,
            settings.max_request_body_bytes,
            settings.request_body_timeout,
        )
    });
    *upload = Some(req.body().progress());
    let mut last = None;
    for ep in &endpoints {
        tracing::debug!(path = %req.uri().path(), endpoint = %ep.address, identity = %ep.identity, "forwarding");
        last = Some(ep.address);
        let key = (ep.hbone, ep.address, ep.identity.clone());
        // An idle connection to this endpoint first. One that closed since it was pooled
        // gives the request back, and a new tunnel takes it.
        if let Some(mut sender) = shared.pool.checkout(&key) {
            match proxy::exchange(&mut sender, req, shared.settings.response_timeout).await {
                Exchange::Answered(resp) => {
                    shared.pool.put_back_when_ready(key, sender);
                    return answered(shared, resp, Flag::None, ep);
                }
                Exchange::Failed(resp, flag) => return answered(shared, resp, flag, ep),
                Exchange::NotSent(back) => req = back,
            }
        }
        // The tunnel carries no `Forwarded` header: it serves many clients in turn, and each
        // request names its own client in its HTTP headers. It carries the trace context of
        // the request that opens it (the listener set the gateway's span in it).
        let new_target = || {
            Target::new(
                ep.hbone,
                ep.address,
                shared.settings.identity.clone(),
                ep.identity.clone(),
            )
        };
        let target = match req.headers().get(TRACEPARENT).map(|v| v.to_str()) {
            // Always valid: the listener wrote it.
            Some(Ok(tp)) => new_target()
                .traceparent(tp)
                .unwrap_or_else(|_| new_target()),
            _ => new_target(),
        };
        let tunnel = match shared.client.open(target).await {
            Ok(tunnel) => tunnel,
            Err(e) => {
                tracing::info!(endpoint = %ep.address, workload = %ep.workload, error = %e, "endpoint unreachable; trying the next");
                continue;
            }
        };
        let mut sender = match proxy::connect(tunnel, &shared.metrics).await {
            Ok(sender) => sender,
            Err(resp) => return answered(shared, resp, Flag::UpstreamConnectionFailure, ep),
        };
        return match proxy::exchange(&mut sender, req, shared.settings.response_timeout).await {
            Exchange::Answered(resp) => {
                shared.pool.put_back_when_ready(key, sender);
                answered(shared, resp, Flag::None, ep)
            }
            Exchange::Failed(resp, flag) => answered(shared, resp, flag, ep),
            Exchange::NotSent(_) => refuse(
                StatusCode::BAD_GATEWAY,
                "backend connection closed before the request",
                Flag::UpstreamConnectionTermination,
                Some(ep.address),
            ),
        };
    }
    refuse(
        StatusCode::SERVICE_UNAVAILABLE,
        "no endpoint reachable",
        Flag::UpstreamConnectionFailure,
        last,
    )
}

/// The backend's answer; when the settings ask for it, naming the workload that answered and
/// the identity its end of the tunnel proved (the tunnel opens only when the peer presents
/// exactly this identity).
fn answered(shared: &Shared, mut resp: Response<Body>, flag: Flag, ep: &Endpoint) -> Forwarded {
    if shared.settings.expose_backend_headers {
        proxy::name_backend(resp.headers_mut(), ep);
    }
    Forwarded {
        resp,
        flag,
        endpoint: Some(ep.address),
    }
}
