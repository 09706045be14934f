//! The ADS server: `envoy.service.discovery.v3.AggregatedDiscoveryService`, both
//! `StreamAggregatedResources` (State of the World) and `DeltaAggregatedResources`, serving
//! the current [`Snapshot`] of a [`SnapshotCache`].
//!
//! Each stream's protocol state is a plain struct ([`SotwStream`], [`DeltaStream`]) that takes
//! requests and snapshots and returns the responses to send; the tonic service is a thin loop
//! around it.
//!
//! What is pushed:
//! - SotW: a type is answered when it is first requested, when its subscribed names change,
//!   and when the resources the subscription covers change (by content version); never on an
//!   ACK or a NACK alone. Each response carries all covered resources, as SotW requires.
//! - Delta: only resources whose content version differs from what the client holds, and the
//!   names that were removed. The first request for a type is always answered (empty if need
//!   be) so a client does not wait; explicitly subscribed names that do not exist are reported
//!   in `removed_resources` once.
//! - NACKs (a request with `error_detail`) are logged with the node, type, nonce and message;
//!   the rejected version is not re-sent, and the next change is pushed as usual.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hasher;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as Wrapped,
};
use futures::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::snapshot::{Snapshot, SnapshotCache, TypeSnapshot};

/// The ADS service over a [`SnapshotCache`]. Add [`AdsServer::into_service`] to a tonic
/// server, or use [`AdsServer::serve`].
#[derive(Debug, Clone)]
pub struct AdsServer {
    cache: SnapshotCache,
    stop: Option<watch::Receiver<bool>>,
}

/// State-of-the-World protocol state of one stream.
#[derive(Debug, Default)]
pub struct SotwStream {
    node: String,
    types: BTreeMap<String, SotwType>,
    nonce: u64,
}

#[derive(Debug, Default)]
struct SotwType {
    wildcard: bool,
    names: BTreeSet<String>,
    /// Fingerprint of what was last sent; `None` forces a response.
    sent: Option<u64>,
}

/// Delta protocol state of one stream.
#[derive(Debug, Default)]
pub struct DeltaStream {
    node: String,
    types: BTreeMap<String, DeltaType>,
    nonce: u64,
}

#[derive(Debug, Default)]
struct DeltaType {
    wildcard: bool,
    names: BTreeSet<String>,
    /// Name to the version the client holds.
    known: HashMap<String, String>,
    /// Explicitly subscribed names already reported as not existing.
    reported_missing: BTreeSet<String>,
    /// Answer even when there is nothing to send (first request).
    must_answer: bool,
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

// === impl AdsServer ===

impl AdsServer {
    /// Serves `cache`.
    pub fn new(cache: SnapshotCache) -> Self {
        Self { cache, stop: None }
    }

    /// Ends every open stream (with status OK) when `stop` turns true, so that a graceful
    /// server shutdown does not wait for clients to hang up.
    pub fn with_stop(mut self, stop: watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// The tonic service, with message size limits lifted (snapshots can be large).
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(16 * 1024 * 1024)
            .max_encoding_message_size(usize::MAX)
    }

    /// Serves on `listener` until `shutdown` completes.
    ///
    /// # Errors
    ///
    /// When the tonic server fails.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
            .add_service(self.into_service())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_sotw(
            self.cache.clone(),
            self.stop.clone(),
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_delta(
            self.cache.clone(),
            self.stop.clone(),
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The I/O loop shared by both variants: requests and snapshot changes in, responses out.
macro_rules! stream_loop {
    ($cache:expr, $stop:expr, $requests:expr, $tx:expr, $state:expr) => {{
        let mut snapshots = $cache.subscribe();
        let mut stop = $stop;
        loop {
            let responses = tokio::select! {
                () = stopped(&mut stop) => break,
                msg = $requests.message() => {
                    let req = match msg {
                        Ok(Some(req)) => req,
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(node = %$state.node, %status, "ADS stream ended");
                            break;
                        }
                    };
                    let snapshot: Arc<Snapshot> = snapshots.borrow_and_update().clone();
                    $state.handle_request(req);
                    $state.poll(&snapshot)
                }
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let snapshot: Arc<Snapshot> = snapshots.borrow_and_update().clone();
                    $state.poll(&snapshot)
                }
            };
            for response in responses {
                if $tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
        }
    }};
}

/// Completes when `stop` turns true; never without one.
async fn stopped(stop: &mut Option<watch::Receiver<bool>>) {
    match stop {
        Some(rx) => {
            if rx.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

async fn run_sotw(
    cache: SnapshotCache,
    stop: Option<watch::Receiver<bool>>,
    mut requests: Streaming<DiscoveryRequest>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    let mut state = SotwStream::default();
    stream_loop!(cache, stop, requests, tx, state);
}

async fn run_delta(
    cache: SnapshotCache,
    stop: Option<watch::Receiver<bool>>,
    mut requests: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) {
    let mut state = DeltaStream::default();
    stream_loop!(cache, stop, requests, tx, state);
}

// === impl SotwStream ===

impl SotwStream {
    /// Takes one request: records the node, logs ACK/NACK, updates the subscription.
    pub fn handle_request(&mut self, req: DiscoveryRequest) {
        if let Some(node) = &req.node
            && self.node.is_empty()
        {
            self.node = node.id.clone();
            tracing::info!(node = %self.node, "SotW ADS stream opened");
        }
        if let Some(error) = &req.error_detail {
            tracing::warn!(
                node = %self.node, type_url = %req.type_url, nonce = %req.response_nonce,
                version = %req.version_info, error = %error.message,
                "NACK: client rejected configuration"
            );
        } else if !req.response_nonce.is_empty() {
            tracing::debug!(node = %self.node, type_url = %req.type_url, version = %req.version_info, "ACK");
        }
        let first = !self.types.contains_key(&req.type_url);
        let sub = self.types.entry(req.type_url).or_default();
        let mut names: BTreeSet<String> = req.resource_names.into_iter().collect();
        let star = names.remove("*");
        let wildcard = star || (names.is_empty() && (first || sub.wildcard));
        if first || wildcard != sub.wildcard || names != sub.names {
            sub.wildcard = wildcard;
            sub.names = names;
            sub.sent = None;
        }
    }

    /// The responses due for `snapshot`: types first requested, re-subscribed, or whose
    /// covered resources changed.
    pub fn poll(&mut self, snapshot: &Snapshot) -> Vec<DiscoveryResponse> {
        let mut out = Vec::new();
        for (url, sub) in &mut self.types {
            let Some(ts) = snapshot.get_type(url) else {
                if sub.sent.is_none() {
                    tracing::debug!(node = %self.node, type_url = %url, "type not served");
                    sub.sent = Some(0);
                }
                continue;
            };
            let covered: Vec<_> = ts
                .resources()
                .iter()
                .filter(|(name, _)| sub.wildcard || sub.names.contains(*name))
                .collect();
            let mut h = std::hash::DefaultHasher::new();
            for (name, r) in &covered {
                h.write(name.as_bytes());
                h.write_u8(0);
                h.write(r.version.as_bytes());
            }
            let fingerprint = h.finish();
            if sub.sent == Some(fingerprint) {
                continue;
            }
            sub.sent = Some(fingerprint);
            self.nonce += 1;
            out.push(DiscoveryResponse {
                version_info: ts.version().to_owned(),
                resources: covered
                    .into_iter()
                    .map(|(_, r)| r.resource.clone())
                    .collect(),
                type_url: url.clone(),
                nonce: self.nonce.to_string(),
                ..Default::default()
            });
        }
        out
    }
}

// === impl DeltaStream ===

impl DeltaStream {
    /// Takes one request: records the node, logs ACK/NACK, updates the subscription.
    pub fn handle_request(&mut self, req: DeltaDiscoveryRequest) {
        if let Some(node) = &req.node
            && self.node.is_empty()
        {
            self.node = node.id.clone();
            tracing::info!(node = %self.node, "Delta ADS stream opened");
        }
        if let Some(error) = &req.error_detail {
            tracing::warn!(
                node = %self.node, type_url = %req.type_url, nonce = %req.response_nonce,
                error = %error.message, "NACK: client rejected configuration"
            );
        } else if !req.response_nonce.is_empty() {
            tracing::debug!(node = %self.node, type_url = %req.type_url, nonce = %req.response_nonce, "ACK");
        }
        let first = !self.types.contains_key(&req.type_url);
        let sub = self.types.entry(req.type_url).or_default();
        if first {
            sub.known = req.initial_resource_versions;
            sub.must_answer = true;
            // Legacy wildcard: a first request that names nothing.
            sub.wildcard = req.resource_names_subscribe.is_empty();
        }
        for name in req.resource_names_subscribe {
            if name == "*" {
                sub.wildcard = true;
            } else {
                sub.names.insert(name);
            }
        }
        for name in &req.resource_names_unsubscribe {
            if name == "*" {
                sub.wildcard = false;
            } else {
                sub.names.remove(name);
                sub.reported_missing.remove(name);
            }
        }
        if !req.resource_names_unsubscribe.is_empty() {
            let (wildcard, names) = (sub.wildcard, &sub.names);
            sub.known.retain(|n, _| wildcard || names.contains(n));
        }
    }

    /// The responses due for `snapshot`: per type, the changed and the removed resources.
    pub fn poll(&mut self, snapshot: &Snapshot) -> Vec<DeltaDiscoveryResponse> {
        let empty = TypeSnapshot::default();
        let mut out = Vec::new();
        for (url, sub) in &mut self.types {
            let ts = snapshot.get_type(url).unwrap_or(&empty);
            let mut resources = Vec::new();
            for (name, r) in ts.resources() {
                if !(sub.wildcard || sub.names.contains(name)) {
                    continue;
                }
                if sub.known.get(name) != Some(&r.version) {
                    sub.known.insert(name.clone(), r.version.clone());
                    sub.reported_missing.remove(name);
                    resources.push(Wrapped {
                        name: name.clone(),
                        version: r.version.clone(),
                        resource: Some(r.resource.clone()),
                        ..Default::default()
                    });
                }
            }
            let mut removed: Vec<String> = sub
                .known
                .keys()
                .filter(|n| !ts.resources().contains_key(*n))
                .cloned()
                .collect();
            for name in &removed {
                sub.known.remove(name);
                sub.reported_missing.insert(name.clone());
            }
            for name in &sub.names {
                if !ts.resources().contains_key(name) && sub.reported_missing.insert(name.clone()) {
                    removed.push(name.clone());
                }
            }
            if resources.is_empty() && removed.is_empty() && !sub.must_answer {
                continue;
            }
            sub.must_answer = false;
            self.nonce += 1;
            out.push(DeltaDiscoveryResponse {
                system_version_info: ts.version().to_owned(),
                resources,
                type_url: url.clone(),
                removed_resources: removed,
                nonce: self.nonce.to_string(),
                ..Default::default()
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    use super::*;
    use crate::control_plane::snapshot::SnapshotBuilder;

    const A: &str = "type.googleapis.com/test.A";
    const B: &str = "type.googleapis.com/test.B";

    /// A snapshot of raw resources: `(type, name, bytes)`.
    fn snapshot(resources: &[(&str, &str, &[u8])]) -> Snapshot {
        let mut b = SnapshotBuilder::new();
        b.declare(A).declare(B);
        for (url, name, bytes) in resources {
            b.add(
                url,
                name,
                &Any {
                    type_url: "x".into(),
                    value: bytes.to_vec(),
                },
            );
        }
        b.build()
    }

    fn sotw_req(url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: url.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn sotw_answers_subscriptions_and_changes_only() {
        let s1 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2"), (B, "b1", b"1")]);
        let mut st = SotwStream::default();
        st.handle_request(sotw_req(A, &[], ""));
        let out = st.poll(&s1);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources.len(), 2, "wildcard gets everything");
        // ACK: nothing.
        st.handle_request(sotw_req(A, &[], &out[0].nonce));
        assert!(st.poll(&s1).is_empty());
        // A change of another type: nothing for A.
        let s2 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2"), (B, "b1", b"changed")]);
        assert!(st.poll(&s2).is_empty());
        // A change of A: the full set again.
        let s3 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"new"), (B, "b1", b"changed")]);
        let out = st.poll(&s3);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources.len(), 2);
        // NACK: logged, not re-sent.
        let mut nack = sotw_req(A, &[], &out[0].nonce);
        nack.error_detail = Some(RpcStatus {
            message: "bad".into(),
            ..Default::default()
        });
        st.handle_request(nack);
        assert!(st.poll(&s3).is_empty());
    }

    #[test]
    fn sotw_named_subscriptions_see_only_their_resources() {
        let s1 = snapshot(&[(B, "b1", b"1"), (B, "b2", b"2")]);
        let mut st = SotwStream::default();
        st.handle_request(sotw_req(B, &["b1"], ""));
        let out = st.poll(&s1);
        assert_eq!(out[0].resources.len(), 1);
        // b2 changes: not subscribed, nothing sent.
        let s2 = snapshot(&[(B, "b1", b"1"), (B, "b2", b"changed")]);
        assert!(st.poll(&s2).is_empty());
        // Subscribing to more names answers at once.
        st.handle_request(sotw_req(B, &["b1", "b2"], "1"));
        let out = st.poll(&s2);
        assert_eq!(out[0].resources.len(), 2);
    }

    #[test]
    fn delta_sends_only_differences() {
        let s1 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["a1", "a2"]);
        assert!(st.poll(&s1).is_empty());

        let s2 = snapshot(&[(A, "a1", b"1"), (A, "a3", b"3")]);
        let out = st.poll(&s2);
        assert_eq!(names(&out[0]), ["a3"]);
        assert_eq!(out[0].removed_resources, ["a2"]);
    }

    #[test]
    fn delta_resumes_from_initial_versions() {
        let s1 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
        let v1 = s1
            .get(A, "a1")
            .map(|r| r.version.clone())
            .unwrap_or_default();
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["*".into()],
            initial_resource_versions: [("a1".to_owned(), v1), ("gone".to_owned(), "x".to_owned())]
                .into_iter()
                .collect(),
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["a2"], "a1 is up to date");
        assert_eq!(out[0].removed_resources, ["gone"]);
    }

    #[test]
    fn delta_reports_missing_names_once_and_honours_unsubscribe() {
        let s1 = snapshot(&[(B, "b1", b"1")]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: B.into(),
            resource_names_subscribe: vec!["b1".into(), "nope".into()],
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["b1"]);
        assert_eq!(out[0].removed_resources, ["nope"]);
        assert!(st.poll(&s1).is_empty());
        // It appears later: sent.
        let s2 = snapshot(&[(B, "b1", b"1"), (B, "nope", b"now")]);
        assert_eq!(names(&st.poll(&s2)[0]), ["nope"]);
        // Unsubscribed: changes are no longer sent, and no removal either.
        st.handle_request(DeltaDiscoveryRequest {
            type_url: B.into(),
            resource_names_unsubscribe: vec!["b1".into()],
            ..Default::default()
        });
        let s3 = snapshot(&[(B, "b1", b"changed"), (B, "nope", b"now")]);
        assert!(st.poll(&s3).is_empty());
    }
}
