//! The admin endpoint of meshkit's parts (node proxy, gateway, control plane): what a
//! Kubernetes probe, a Prometheus scrape and an operator at a terminal ask a running part.
//!
//! | path | answer |
//! |---|---|
//! | `/healthz/ready` | `200 ready` once every [`Readiness`] condition holds; `503` with the reasons otherwise (and while draining) |
//! | `/metrics`, `/stats/prometheus` | the part's [`Registry`] in the OpenMetrics text format (prometheus-client), with build info and process metrics added |
//! | `/config_dump` | the part's current configuration as JSON ([`Admin::with_config_dump`]) |
//! | `/logging?level=FILTER` | a `PUT` sets the log filter ([`Admin::with_log_filter`]); a `GET` shows how to use it, and never changes it |
//!
//! # Browsers
//!
//! The endpoint has no authentication, so it must not be reachable by a web page that an
//! operator's browser opens:
//!
//! - **Forged changes.** Only a `PUT` changes the log filter. A page can send a `GET` or a
//!   form's `POST` anywhere, but a `PUT` to another origin needs the CORS preflight, which the
//!   endpoint never grants; a request whose `Origin` is not the endpoint itself is refused
//!   (`403`) whatever its method.
//! - **DNS rebinding.** A page whose name is made to resolve to the endpoint's address
//!   reaches it as the same origin; its requests still carry the page's name in `Host`. Every
//!   request's `Host` must be an IP address, `localhost`, or a name given to
//!   [`Admin::with_allowed_hosts`]; others get `421 Misdirected Request`. Probes and scrapes
//!   address a Pod by its IP, so they pass.
//!
//! It also formats access-log lines ([`AccessLog`]), the same way in every part.
//!
//! An embedding service either mounts [`Admin::handle`] on a server of its own, or runs
//! [`Admin::serve`] on a listener (by default on localhost: the endpoint is unauthenticated,
//! and `/logging` changes the process).
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use meshkit_admin::{Admin, Readiness};
//! use prometheus_client::metrics::counter::Counter;
//! use prometheus_client::registry::Registry;
//!
//! let mut registry = Registry::default();
//! let requests = Counter::<u64>::default();
//! registry.register("requests", "Requests served", requests.clone());
//!
//! let readiness = Readiness::default();
//! let listeners = readiness.condition("listeners bound");
//! let admin = Admin::new("my-part", registry).with_readiness(readiness);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:15000").await?;
//! tokio::spawn(admin.serve(listener, std::future::pending()));
//! // ... bind the part's listeners, then:
//! listeners.set_ready();
//! requests.inc();
//! # Ok(())
//! # }
//! ```
//!
//! # Stability
//!
//! Pre-1.0: the API may change between minor versions.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod access;
mod process;

pub use access::{AccessLog, Field};

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// The content type of [`Admin`]'s metrics: OpenMetrics text, which Prometheus scrapes.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long a client of [`Admin::serve`] may take to send its request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a part is ready for traffic: a set of named conditions, each of which the part
/// sets once it holds (certificates loaded, first xDS state arrived, listeners bound), and a
/// drain flag that makes the part unready for good. Clones share the state.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: Arc<ReadinessInner>,
}

#[derive(Debug, Default)]
struct ReadinessInner {
    /// Condition id to (name, holds).
    conditions: Mutex<BTreeMap<u64, (String, bool)>>,
    next: AtomicU64,
    draining: AtomicBool,
}

/// One condition of a [`Readiness`]; it starts unmet. Dropping it removes the condition.
#[derive(Debug)]
pub struct Condition {
    readiness: Readiness,
    id: u64,
}

/// Sets the log filter of the running process from a filter string (`info`,
/// `meshkit_hbone=debug,info`, ...), for `/logging?level=`. Built by the program that owns the
/// logging subscriber (meshkit-cli's `init_logging_with_filter`, for meshkit's programs).
#[derive(Clone)]
pub struct LogFilter(Arc<SetFilter>);

type SetFilter = dyn Fn(&str) -> Result<(), String> + Send + Sync;

type ConfigDump = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The admin endpoint of one part: see the [crate] documentation for its paths.
#[derive(Clone)]
pub struct Admin {
    component: String,
    registry: Arc<Registry>,
    readiness: Readiness,
    config_dump: Option<ConfigDump>,
    log_filter: Option<LogFilter>,
    /// Host names (lowercase, without a port) accepted besides IP addresses and `localhost`.
    allowed_hosts: Arc<[String]>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    component: String,
    version: String,
}

// === impl Readiness ===

impl Readiness {
    /// Adds a condition named `name`, unmet until [`Condition::set_ready`].
    pub fn condition(&self, name: impl Into<String>) -> Condition {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.inner.conditions).insert(id, (name.into(), false));
        Condition {
            readiness: self.clone(),
            id,
        }
    }

    /// Marks the part as draining: unready from now on, whatever its conditions.
    pub fn start_draining(&self) {
        self.inner.draining.store(true, Ordering::Release);
    }

    /// Whether [`start_draining`](Self::start_draining) was called.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// `Ok` when ready; otherwise why not: `draining`, or the names of the unmet conditions.
    ///
    /// # Errors
    ///
    /// The reasons the part is not ready, one per entry.
    pub fn check(&self) -> Result<(), Vec<String>> {
        if self.is_draining() {
            return Err(vec!["draining".to_owned()]);
        }
        let unmet: Vec<String> = lock(&self.inner.conditions)
            .values()
            .filter(|(_, holds)| !holds)
            .map(|(name, _)| format!("waiting for {name}"))
            .collect();
        if unmet.is_empty() { Ok(()) } else { Err(unmet) }
    }
}

// === impl Condition ===

impl Condition {
    /// The condition holds.
    pub fn set_ready(&self) {
        self.set(true);
    }

    /// The condition no longer holds (for example, the certificates expired).
    pub fn set_unready(&self) {
        self.set(false);
    }

    fn set(&self, holds: bool) {
        if let Some(entry) = lock(&self.readiness.inner.conditions).get_mut(&self.id) {
            entry.1 = holds;
        }
    }
}

impl Drop for Condition {
    fn drop(&mut self) {
        lock(&self.readiness.inner.conditions).remove(&self.id);
    }
}

// === impl LogFilter ===

impl LogFilter {
    /// A filter setter from `set`, which returns why a filter string was refused.
    pub fn new(set: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static) -> Self {
        Self(Arc::new(set))
    }

    /// Sets the filter.
    ///
    /// # Errors
    ///
    /// Why `filter` was refused (it does not parse).
    pub fn set(&self, filter: &str) -> Result<(), String> {
        (self.0)(filter)
    }
}

impl std::fmt::Debug for LogFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogFilter")
    }
}

// === impl Admin ===

impl Admin {
    /// The admin endpoint of `component` (for example `node-proxy`), serving `registry` with
    /// `meshkit_build_info{component,version}` and the process metrics (`process_*`: CPU
    /// seconds, resident and virtual memory, open file descriptors, threads, start time)
    /// added to it. Ready at once unless [`with_readiness`](Self::with_readiness) gives
    /// conditions.
    pub fn new(component: impl Into<String>, mut registry: Registry) -> Self {
        let component = component.into();
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                component: component.clone(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        registry.register(
            "meshkit_build",
            "meshkit's version and the part running it (always 1)",
            build,
        );
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        Self {
            component,
            registry: Arc::new(registry),
            readiness: Readiness::default(),
            config_dump: None,
            log_filter: None,
            allowed_hosts: Arc::from([]),
        }
    }

    /// Also accepts requests whose `Host` is one of `names` (a Service's DNS name, for
    /// example), besides IP addresses and `localhost`. See [Browsers](crate#browsers).
    pub fn with_allowed_hosts<S: AsRef<str>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        let mut allowed = self.allowed_hosts.to_vec();
        allowed.extend(
            names
                .into_iter()
                .map(|n| n.as_ref().trim_end_matches('.').to_ascii_lowercase()),
        );
        self.allowed_hosts = allowed.into();
        self
    }

    /// Answers `/healthz/ready` from `readiness`.
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Answers `/config_dump` with what `dump` returns at each request. It must never hold
    /// private keys.
    pub fn with_config_dump(
        mut self,
        dump: impl Fn() -> serde_json::Value + Send + Sync + 'static,
    ) -> Self {
        self.config_dump = Some(Arc::new(dump));
        self
    }

    /// Lets `/logging?level=` set the log filter.
    pub fn with_log_filter(mut self, filter: LogFilter) -> Self {
        self.log_filter = Some(filter);
        self
    }

    /// The part's [`Readiness`].
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// The metrics as served at `/metrics`.
    pub fn metrics_text(&self) -> String {
        let mut text = String::new();
        // Writing to a String does not fail; a collector that fails is skipped.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        text
    }

    /// Answers one admin request. The request's body is not read: every path is a GET (or,
    /// for `/logging`, a PUT with the filter in the query). A request from a browser that
    /// the endpoint must not serve is refused first ([Browsers](crate#browsers)).
    pub fn handle<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        if let Some(refusal) = self.refusal(request) {
            return refusal;
        }
        let path = request.uri().path();
        let method = request.method();
        let read_only = method == Method::GET || method == Method::HEAD;
        match path {
            "/healthz/ready" | "/ready" if read_only => match self.readiness.check() {
                Ok(()) => text(StatusCode::OK, "ready\n".to_owned()),
                Err(reasons) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", reasons.join("; ")),
                ),
            },
            "/metrics" | "/stats/prometheus" if read_only => Response::builder()
                .header(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)
                .body(Full::new(Bytes::from(self.metrics_text())))
                .unwrap_or_else(|_| internal()),
            "/config_dump" if read_only => match &self.config_dump {
                Some(dump) => {
                    let body = serde_json::to_vec_pretty(&dump()).unwrap_or_default();
                    Response::builder()
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from(body)))
                        .unwrap_or_else(|_| internal())
                }
                None => text(
                    StatusCode::NOT_FOUND,
                    format!("{} has no config dump\n", self.component),
                ),
            },
            "/logging" => self.logging(request),
            "/" if read_only => text(
                StatusCode::OK,
                format!(
                    "{} admin: /healthz/ready /metrics /stats/prometheus /config_dump /logging?level=FILTER\n",
                    self.component
                ),
            ),
            "/healthz/ready" | "/ready" | "/metrics" | "/stats/prometheus" | "/config_dump"
            | "/" => text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_owned()),
            _ => text(
                StatusCode::NOT_FOUND,
                format!("no such admin path: {path}\n"),
            ),
        }
    }

    /// The answer to a request whose `Host` a rebound DNS name could have set, or whose
    /// `Origin` is another site; `None` for a request to serve.
    fn refusal<B>(&self, request: &Request<B>) -> Option<Response<Full<Bytes>>> {
        let host = match request.headers().get(header::HOST) {
            Some(value) => Some(value.to_str().unwrap_or("\u{fffd}")),
            None => request.uri().authority().map(http::uri::Authority::as_str),
        };
        if let Some(host) = host
            && !self.host_allowed(host)
        {
            tracing::warn!(
                host,
                "admin request refused: Host is not an address of this endpoint"
            );
            return Some(text(
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "host {host:?} is not this admin endpoint's: use its IP address or localhost\n"
                ),
            ));
        }
        if let Some(origin) = request.headers().get(header::ORIGIN) {
            let same = origin
                .to_str()
                .ok()
                .and_then(|o| o.split_once("://"))
                .is_some_and(|(_, authority)| {
                    host.is_some_and(|h| authority.eq_ignore_ascii_case(h))
                });
            if !same {
                tracing::warn!(
                    ?origin,
                    "admin request refused: sent by a page of another origin"
                );
                return Some(text(
                    StatusCode::FORBIDDEN,
                    "requests from another origin are refused\n".to_owned(),
                ));
            }
        }
        None
    }

    /// Whether `host` (a `Host` header: a name or address, with an optional port) names this
    /// endpoint: an IP address, `localhost`, or an allowed name.
    fn host_allowed(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            // `[v6]` or `[v6]:port`.
            Some(rest) => match rest.split_once(']') {
                Some((v6, port)) if port.is_empty() || port.starts_with(':') => {
                    return v6.parse::<std::net::Ipv6Addr>().is_ok();
                }
                _ => return false,
            },
            None => host.rsplit_once(':').map_or(host, |(name, _)| name),
        };
        let name = name.trim_end_matches('.');
        name.parse::<std::net::Ipv4Addr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || self
                .allowed_hosts
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(name))
    }

    fn logging<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        let Some(filter) = &self.log_filter else {
            return text(
                StatusCode::NOT_FOUND,
                format!("{} cannot change its log filter\n", self.component),
            );
        };
        let level = request.uri().query().and_then(|q| {
            q.split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| *k == "level")
                .map(|(_, v)| percent_decode(v))
        });
        match level {
            None => text(
                StatusCode::OK,
                "set the log filter with PUT /logging?level=FILTER, for example level=debug or level=meshkit_hbone=debug,info\n"
                    .to_owned(),
            ),
            // A page can send a GET or a POST to any site without asking; a PUT to another
            // origin needs a CORS preflight, which is never granted.
            Some(_) if request.method() != Method::PUT => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "changing the log filter takes a PUT: curl -X PUT '.../logging?level=FILTER'\n"
                    .to_owned(),
            ),
            Some(Err(())) => text(StatusCode::BAD_REQUEST, "level is not valid UTF-8 percent-encoding\n".to_owned()),
            Some(Ok(level)) => match filter.set(&level) {
                Ok(()) => {
                    tracing::info!(filter = %level, "log filter changed");
                    text(StatusCode::OK, format!("log filter: {level}\n"))
                }
                Err(why) => text(
                    StatusCode::BAD_REQUEST,
                    format!("log filter {level:?} refused: {why}\n"),
                ),
            },
        }
    }

    /// Serves the admin paths over HTTP/1.1 on `listener` until `shutdown` completes; each
    /// connection on its own task, with a 10 s bound on its request head.
    ///
    /// # Errors
    ///
    /// None today: accept errors are logged and retried after a pause. The `Result` leaves
    /// room for setup errors.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()> {
        let admin = Arc::new(self);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (sock, _) = tokio::select! {
                () = &mut shutdown => return Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let admin = Arc::clone(&admin);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let response = admin.handle(&request);
                        async move { Ok::<_, Infallible>(response) }
                    });
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .serve_connection(TokioIo::new(sock), service)
                    .await;
                if let Err(e) = served {
                    tracing::debug!(error = %e, "admin connection ended with an error");
                }
            });
        }
    }
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("component", &self.component)
            .field("readiness", &self.readiness)
            .finish_non_exhaustive()
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| internal())
}

fn internal() -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(b"internal error\n")));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

/// Decodes `%XX` escapes and `+` (a space in a query).
fn percent_decode(value: &str) -> Result<String, ()> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or(())?;
                let hex = std::str::from_utf8(hex).map_err(drop)?;
                out.push(u8::from_str_radix(hex, 16).map_err(drop)?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(drop)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(admin: &Admin, uri: &str) -> (StatusCode, String) {
        send(admin, Method::GET, uri)
    }

    fn send(admin: &Admin, method: Method, uri: &str) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        let response = admin.handle(&Request::builder().method(method).uri(uri).body(()).unwrap());
        let status = response.status();
        let body = block_on(response.into_body().collect());
        (
            status,
            String::from_utf8(body.unwrap().to_bytes().to_vec()).unwrap(),
        )
    }

    /// The body of a `Full` is ready at once.
    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn readiness_follows_its_conditions_and_the_drain() {
        let readiness = Readiness::default();
        let admin = Admin::new("test", Registry::default()).with_readiness(readiness.clone());
        let certs = readiness.condition("certificates");
        let xds = readiness.condition("first xDS state");
        let (status, body) = get(&admin, "/healthz/ready");
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "not ready: waiting for certificates; waiting for first xDS state\n"
        );
        certs.set_ready();
        xds.set_ready();
        assert_eq!(
            get(&admin, "/healthz/ready"),
            (StatusCode::OK, "ready\n".into())
        );
        certs.set_unready();
        assert_eq!(
            get(&admin, "/healthz/ready").0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        certs.set_ready();
        readiness.start_draining();
        assert_eq!(
            get(&admin, "/healthz/ready"),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: draining\n".into()
            )
        );
    }

    #[test]
    fn a_dropped_condition_no_longer_counts() {
        let readiness = Readiness::default();
        let gone = readiness.condition("gone");
        assert!(readiness.check().is_err());
        drop(gone);
        assert_eq!(readiness.check(), Ok(()));
    }

    #[test]
    fn logging_sets_the_filter_or_says_why_not() {
        let set = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = Arc::clone(&set);
        let admin =
            Admin::new("test", Registry::default()).with_log_filter(LogFilter::new(move |f| {
                if f.contains('!') {
                    return Err("not a filter".into());
                }
                lock(&seen).push(f.to_owned());
                Ok(())
            }));
        let (status, _) = send(
            &admin,
            Method::PUT,
            "/logging?level=meshkit_hbone%3Ddebug,info",
        );
        assert_eq!(status, StatusCode::OK);
        assert_eq!(*lock(&set), ["meshkit_hbone=debug,info"]);
        let (status, body) = send(&admin, Method::PUT, "/logging?level=bad!");
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("not a filter"), "{body}");
        assert_eq!(
            send(&admin, Method::PUT, "/logging?level=%zz").0,
            StatusCode::BAD_REQUEST
        );
        // A GET (a link) or a POST (a form) is what any web page can send: neither changes it.
        for method in [Method::GET, Method::POST] {
            assert_eq!(
                send(&admin, method, "/logging?level=trace").0,
                StatusCode::METHOD_NOT_ALLOWED
            );
        }
        assert_eq!(get(&admin, "/logging").0, StatusCode::OK);
        assert_eq!(lock(&set).len(), 1);
    }

    #[test]
    fn unknown_paths_and_methods_are_refused() {
        let admin = Admin::new("test", Registry::default());
        assert_eq!(get(&admin, "/nope").0, StatusCode::NOT_FOUND);
        assert_eq!(get(&admin, "/config_dump").0, StatusCode::NOT_FOUND);
        assert_eq!(
            send(&admin, Method::PUT, "/logging?level=info").0,
            StatusCode::NOT_FOUND
        );
        let post = admin.handle(&Request::post("/metrics").body(()).unwrap());
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    fn with_headers(admin: &Admin, method: Method, headers: &[(&str, &str)]) -> StatusCode {
        let mut request = Request::builder().method(method).uri("/logging?level=info");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        admin.handle(&request.body(()).unwrap()).status()
    }

    #[test]
    fn a_rebound_name_or_a_foreign_page_is_refused() {
        let admin = Admin::new("test", Registry::default())
            .with_log_filter(LogFilter::new(|_| Ok(())))
            .with_allowed_hosts(["admin.infra.svc"]);
        let put = |headers: &[(&str, &str)]| with_headers(&admin, Method::PUT, headers);
        for host in [
            "127.0.0.1:15000",
            "10.1.2.3",
            "[::1]:15000",
            "[fd00::7]",
            "localhost:15000",
            "LOCALHOST",
            "admin.infra.svc:15000",
            "admin.infra.svc.",
        ] {
            assert_eq!(put(&[("host", host)]), StatusCode::OK, "{host}");
        }
        // A page whose name was rebound to the endpoint's address sends its own name.
        for host in [
            "attacker.example:15000",
            "attacker.example",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "[::1",
            "[::1]x",
            "",
        ] {
            assert_eq!(
                put(&[("host", host)]),
                StatusCode::MISDIRECTED_REQUEST,
                "{host}"
            );
        }
        // Reading is refused as well: the dump must not reach the page.
        assert_eq!(
            with_headers(&admin, Method::GET, &[("host", "attacker.example")]),
            StatusCode::MISDIRECTED_REQUEST
        );
        // A page of another origin, even with the right Host.
        assert_eq!(
            put(&[
                ("host", "127.0.0.1:15000"),
                ("origin", "https://attacker.example")
            ]),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            put(&[("host", "127.0.0.1:15000"), ("origin", "null")]),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            put(&[
                ("host", "127.0.0.1:15000"),
                ("origin", "http://127.0.0.1:15000")
            ]),
            StatusCode::OK
        );
    }
}
