//! One request seen from the outside: its span and trace context when it arrives; the
//! metrics and the access-log line once its answer has been sent (or the exchange ended
//! otherwise: the client left, the backend reset the answer).
//!
//! The steps of the stack say how they served a request in a [`Served`] response extension:
//! the configuration, the route and endpoint, and the [`Flag`] of a failure. The listener
//! ([`Observation`]) adds what only it sees: the status sent, the bytes, the duration.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, Uri, Version};
use meshkit_admin::Field;
use tokio::sync::watch;

use crate::metrics::{Handles, RequestLabels, StatsKey};
use crate::proxy::{Body, Progress};
use crate::stack::RouteTarget;
use crate::trace::{Origin, TraceContext};
use crate::{Compiled, Shared};

/// The access-log target (meshkit-admin's [`AccessLog`](meshkit_admin::AccessLog) logs there).
const ACCESS_TARGET: &str = "meshkit::access";

/// Envoy's response flags, for the failures the gateway tells apart (Istio's
/// `response_flags` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) enum Flag {
    /// Nothing went wrong on the gateway's side (the backend's own errors included).
    #[default]
    None,
    /// `DPE`: the request itself was unusable (no host, two `Host` headers).
    DownstreamProtocolError,
    /// `NR`: no route, or a route without a service backend.
    NoRoute,
    /// `NC`: the routed service, or its port, is not in the mesh.
    NoCluster,
    /// `UH`: the service has no endpoints.
    NoHealthyUpstream,
    /// `UF`: no endpoint's tunnel could be opened, or HTTP/1.1 could not start in it.
    UpstreamConnectionFailure,
    /// `UC`: the backend connection ended before an answer.
    UpstreamConnectionTermination,
    /// `UPE`: the backend answered something other than HTTP/1.1.
    UpstreamProtocolError,
    /// `UT`: the backend did not answer within the response timeout.
    UpstreamRequestTimeout,
    /// `UR`: the backend's answer failed midway (its tunnel was reset).
    UpstreamRemoteReset,
    /// `DC`: the client went away before the answer was sent to its end.
    DownstreamConnectionTermination,
}

/// How the stack served a request (a response extension its steps set on every answer).
#[derive(Clone)]
pub(crate) struct Served {
    /// The configuration the request was served with.
    pub(crate) config: Arc<Compiled>,
    /// What routing found, if it got that far.
    pub(crate) target: Option<RouteTarget>,
    /// The matched route's key ([`route_key`]); 0 for none.
    pub(crate) route: usize,
    /// The endpoint that answered (or the last one tried).
    pub(crate) endpoint: Option<SocketAddr>,
    /// What went wrong.
    pub(crate) flag: Flag,
    /// The request body's progress (its bytes), once it went to a backend.
    pub(crate) upload: Option<watch::Receiver<Progress>>,
}

/// One request from its head to the end of its answer. Dropping it records the request:
/// its metrics and its access-log line.
pub(crate) struct Observation {
    shared: Arc<Shared>,
    start: Instant,
    client: SocketAddr,
    method: Method,
    uri: Uri,
    host: Option<HeaderValue>,
    version: Version,
    grpc: bool,
    trace: TraceContext,
    span: tracing::Span,
    /// The status sent; 0 until there is one.
    code: u16,
    served: Option<Served>,
    bytes_sent: u64,
    /// The answer's body was sent to its end.
    ended: bool,
    /// The answer's body failed (the backend's side).
    body_failed: bool,
}

// === impl Flag ===

impl Flag {
    /// The flag as Envoy writes it; `-` for none.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::None => "-",
            Self::DownstreamProtocolError => "DPE",
            Self::NoRoute => "NR",
            Self::NoCluster => "NC",
            Self::NoHealthyUpstream => "UH",
            Self::UpstreamConnectionFailure => "UF",
            Self::UpstreamConnectionTermination => "UC",
            Self::UpstreamProtocolError => "UPE",
            Self::UpstreamRequestTimeout => "UT",
            Self::UpstreamRemoteReset => "UR",
            Self::DownstreamConnectionTermination => "DC",
        }
    }
}

/// The key of a matched route in its configuration: the address of its backend in the route
/// table, which does not move while the configuration lives.
pub(crate) fn route_key(route: &meshkit_ingress_model::RouteMatch<'_>) -> usize {
    std::ptr::from_ref(route.backend()).addr()
}

/// Sets how `resp` was served.
pub(crate) fn served(mut resp: Response<Body>, served: Served) -> Response<Body> {
    resp.extensions_mut().insert(served);
    resp
}

// === impl Observation ===

impl Observation {
    /// Starts observing `req`: continues its trace (rewriting its `traceparent`) and opens its
    /// span.
    pub(crate) fn start<B>(shared: &Arc<Shared>, client: SocketAddr, req: &mut Request<B>) -> Self {
        let start = Instant::now();
        let (trace, origin) = TraceContext::continue_from(req.headers_mut());
        let grpc = req
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let span = tracing::info_span!(
            "request",
            trace_id = %trace.trace_hex(),
            span_id = %trace.span_hex(),
            traceparent = origin.as_str(),
            client = %client,
            method = %req.method(),
            path = req.uri().path(),
        );
        if origin == Origin::Replaced {
            span.in_scope(|| tracing::debug!("invalid traceparent replaced"));
        }
        Self {
            shared: shared.clone(),
            start,
            client,
            method: req.method().clone(),
            uri: req.uri().clone(),
            host: req.headers().get(header::HOST).cloned(),
            version: req.version(),
            grpc,
            trace,
            span,
            code: 0,
            served: None,
            bytes_sent: 0,
            ended: false,
            body_failed: false,
        }
    }

    /// The request's span.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The stack's answer: its status and how it was served.
    pub(crate) fn answered(&mut self, resp: &mut Response<Body>) {
        self.code = resp.status().as_u16();
        self.served = resp.extensions_mut().remove::<Served>();
    }

    /// `n` more bytes of the answer's body went to the client.
    pub(crate) fn sent(&mut self, n: usize) {
        self.bytes_sent += n as u64;
    }

    /// The answer's body was sent to its end.
    pub(crate) fn ended(&mut self) {
        self.ended = true;
    }

    /// The answer's body failed.
    pub(crate) fn body_failed(&mut self) {
        self.body_failed = true;
    }

    fn flag(&self) -> Flag {
        let flag = self.served.as_ref().map_or(Flag::None, |s| s.flag);
        if flag != Flag::None {
            flag
        } else if self.body_failed {
            Flag::UpstreamRemoteReset
        } else if self.code == 0 || !self.ended {
            Flag::DownstreamConnectionTermination
        } else {
            Flag::None
        }
    }

    fn record(&mut self) {
        let elapsed = self.start.elapsed();
        let flag = self.flag();
        let served = self.served.take();
        let config = match &served {
            Some(s) => s.config.clone(),
            None => self.shared.current.borrow().clone(),
        };
        let key = StatsKey {
            route: served.as_ref().map_or(0, |s| s.route),
            endpoint: served.as_ref().and_then(|s| s.endpoint),
            code: self.code,
            flag,
            grpc: self.grpc,
        };
        let target = served.as_ref().and_then(|s| s.target.as_ref());
        let handles = config.stats.get_or_insert(&key, || {
            self.shared.metrics.handles(labels(
                &self.shared,
                &config,
                target,
                self.uri.path(),
                &key,
            ))
        });
        handles.requests.inc();
        handles.duration.observe(elapsed);
        if tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO) {
            let received = served
                .as_ref()
                .and_then(|s| s.upload.as_ref())
                .map_or(0, |u| u.borrow().received);
            let _enter = self.span.enter();
            self.log(&handles, target, received, elapsed.as_millis());
        }
    }

    fn log(&self, handles: &Handles, target: Option<&RouteTarget>, received: u64, ms: u128) {
        let host = match target {
            Some(t) => t.host.as_str(),
            None => self
                .uri
                .authority()
                .map(|a| a.as_str())
                .or_else(|| self.host.as_ref().and_then(|h| h.to_str().ok()))
                .unwrap_or("-"),
        };
        let labels = &handles.labels;
        let trace = self.trace.trace_hex().to_string();
        let version = match self.version {
            Version::HTTP_09 => "HTTP/0.9",
            Version::HTTP_10 => "HTTP/1.0",
            Version::HTTP_11 => "HTTP/1.1",
            Version::HTTP_2 => "HTTP/2",
            Version::HTTP_3 => "HTTP/3",
            _ => "-",
        };
        let client = self.client.to_string();
        self.shared.settings.access_log.log(&[
            ("client", Field::Str(&client)),
            ("method", Field::Str(self.method.as_str())),
            ("host", Field::Str(host)),
            ("path", Field::Str(self.uri.path())),
            ("protocol", Field::Str(version)),
            ("status", Field::Num(u64::from(self.code))),
            ("flags", Field::Str(labels.response_flags)),
            ("route", Field::Str(&labels.route)),
            (
                "destination_service",
                Field::Str(&labels.destination_service),
            ),
            (
                "destination_workload",
                Field::Str(&labels.destination_workload),
            ),
            (
                "destination_identity",
                Field::Str(&labels.destination_principal),
            ),
            ("bytes_received", Field::Num(received)),
            ("bytes_sent", Field::Num(self.bytes_sent)),
            (
                "duration_ms",
                Field::Num(u64::try_from(ms).unwrap_or(u64::MAX)),
            ),
            ("trace_id", Field::Str(&trace)),
        ]);
    }
}

impl Drop for Observation {
    fn drop(&mut self) {
        self.record();
    }
}

/// The label set of a request first seen with `key` in `config` (the cache's miss path: the
/// strings are looked up again here, once per label set and configuration).
fn labels(
    shared: &Shared,
    config: &Compiled,
    target: Option<&RouteTarget>,
    path: &str,
    key: &StatsKey,
) -> RequestLabels {
    let unknown: Arc<str> = Arc::from("unknown");
    let known = |s: &str| -> Arc<str> {
        if s.is_empty() {
            unknown.clone()
        } else {
            Arc::from(s)
        }
    };
    // The route is found again by the host and path it was found by; the key tells it is
    // the same one.
    let route = target
        .and_then(|t| config.table.route(&t.host, path))
        .filter(|m| key.route != 0 && route_key(m) == key.route);
    let route_label = route.map_or_else(|| unknown.clone(), |m| Arc::from(route_name(&m)));
    let service = target.and_then(|t| config.index.service(&t.namespace, &t.service));
    let workload = key.endpoint.and_then(|a| config.index.workload(a.ip()));
    let source = &shared.source;
    RequestLabels {
        reporter: "source",
        source_workload: source.workload.clone(),
        source_canonical_service: source.workload.clone(),
        source_canonical_revision: source.revision.clone(),
        source_workload_namespace: source.namespace.clone(),
        source_principal: source.principal.clone(),
        destination_workload: workload.map_or_else(|| unknown.clone(), |(w, _)| known(&w.name)),
        destination_canonical_service: workload
            .map_or_else(|| unknown.clone(), |(w, _)| known(&w.name)),
        destination_canonical_revision: workload
            .map_or_else(|| unknown.clone(), |_| Arc::from("latest")),
        destination_workload_namespace: workload
            .map_or_else(|| unknown.clone(), |(w, _)| known(&w.namespace)),
        destination_principal: workload
            .map_or_else(|| unknown.clone(), |(_, id)| Arc::from(id.as_ref())),
        destination_service: service.map_or_else(|| unknown.clone(), |s| known(&s.hostname)),
        destination_service_name: target.map_or_else(|| unknown.clone(), |t| known(&t.service)),
        destination_service_namespace: target
            .map_or_else(|| unknown.clone(), |t| known(&t.namespace)),
        route: route_label,
        request_protocol: if key.grpc { "grpc" } else { "http" },
        response_code: key.code,
        response_flags: key.flag.as_str(),
        connection_security_policy: if workload.is_some() {
            "mutual_tls"
        } else {
            "unknown"
        },
    }
}

/// `NAMESPACE/NAME:PATH` of a matched route.
pub(crate) fn route_name(m: &meshkit_ingress_model::RouteMatch<'_>) -> String {
    let path = match m.source() {
        meshkit_ingress_model::MatchSource::DefaultBackend => "defaultBackend",
        _ => m.path().filter(|p| !p.is_empty()).unwrap_or("*"),
    };
    format!("{}/{}:{path}", m.namespace(), m.ingress_name())
}

/// The source labels: the gateway itself.
#[derive(Debug)]
pub(crate) struct Source {
    pub(crate) workload: Arc<str>,
    pub(crate) revision: Arc<str>,
    pub(crate) namespace: Arc<str>,
    pub(crate) principal: Arc<str>,
}

impl Source {
    pub(crate) fn new(settings: &crate::GatewaySettings) -> Self {
        Self {
            workload: Arc::from(settings.workload_name.as_deref().unwrap_or("unknown")),
            revision: Arc::from(if settings.workload_name.is_some() {
                "latest"
            } else {
                "unknown"
            }),
            namespace: Arc::from(settings.identity.namespace().unwrap_or("unknown")),
            principal: Arc::from(settings.identity.as_ref()),
        }
    }
}
