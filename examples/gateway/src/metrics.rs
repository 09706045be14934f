//! The gateway's Prometheus metrics, through prometheus-client:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `istio_requests_total` | counter | [`RequestLabels`] |
//! | `istio_request_duration_milliseconds` | histogram (Envoy's and so Istio's default buckets, [`DURATION_BUCKETS_MS`]) | [`RequestLabels`] |
//! | `meshkit_gateway_downstream_connections` | gauge | client connections open |
//! | `meshkit_gateway_upstream_connections` | gauge | HBONE connections (mutual TLS, HTTP/2) open to node proxies |
//! | `meshkit_gateway_upstream_connections_opened_total` | counter | HBONE connections established |
//! | `meshkit_gateway_upstream_tunnels` | gauge | HBONE tunnels open, each carrying one HTTP/1.1 backend connection, busy or pooled |
//! | `meshkit_gateway_upstream_tunnels_opened_total` | counter | tunnels opened (a new backend connection) |
//! | `meshkit_gateway_upstream_tunnels_idle` | gauge | pooled backend connections waiting for a request |
//! | `meshkit_gateway_routes` | gauge | routes of the current configuration |
//! | `meshkit_gateway_tls_certificate_expiry_timestamp_seconds` | gauge, `namespace`, `name` | when each TLS Secret's leaf certificate expires |
//!
//! The request metrics are counted once per request, when its answer has been sent (or the
//! exchange ended otherwise): the label set is looked up once, in a cache of the current
//! configuration keyed by a few numbers (route, endpoint, code, flag, protocol), which holds
//! the counter and histogram handles; a request then costs one hash lookup under a read lock
//! and three atomic additions. The gauges of connections and the routes are read at scrape
//! time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::Shared;
use crate::observe::Flag;

/// The upper bounds of `istio_request_duration_milliseconds`'s buckets: Envoy's default
/// histogram buckets, which Istio's standard metrics use (0.5 ms to one hour), then `+Inf`.
pub const DURATION_BUCKETS_MS: [f64; 19] = [
    0.5,
    1.0,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1_000.0,
    2_500.0,
    5_000.0,
    10_000.0,
    30_000.0,
    60_000.0,
    300_000.0,
    600_000.0,
    1_800_000.0,
    3_600_000.0,
];

/// [`DURATION_BUCKETS_MS`] in microseconds, what an observation is compared with.
const BOUNDS_US: [u64; 19] = {
    let mut out = [0u64; 19];
    let mut i = 0;
    while i < 19 {
        out[i] = (DURATION_BUCKETS_MS[i] * 1000.0) as u64;
        i += 1;
    }
    out
};

/// The label cache of one configuration holds at most this many label sets; past it, a
/// request's handles are looked up in the families directly (still counted, more slowly).
const MAX_CACHED: usize = 4096;

/// The labels of `istio_requests_total` and `istio_request_duration_milliseconds`, Istio's
/// standard names (a value not known is `unknown`, as Istio writes it), plus `route`.
///
/// The gateway reports as Istio's gateways do, as the client of the backend:
/// `reporter="source"`, the gateway itself as the source.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// Always `source`.
    pub(crate) reporter: &'static str,
    /// The gateway's workload name ([`GatewaySettings::workload_name`](crate::GatewaySettings::workload_name)).
    pub(crate) source_workload: Arc<str>,
    /// Istio's default canonical service: the workload name.
    pub(crate) source_canonical_service: Arc<str>,
    /// Istio's default canonical revision, `latest` (`unknown` without a workload name).
    pub(crate) source_canonical_revision: Arc<str>,
    /// The namespace of the gateway's SPIFFE ID.
    pub(crate) source_workload_namespace: Arc<str>,
    /// The gateway's SPIFFE ID.
    pub(crate) source_principal: Arc<str>,
    /// The workload that answered.
    pub(crate) destination_workload: Arc<str>,
    /// Its canonical service: the workload name (the mesh carries no labels).
    pub(crate) destination_canonical_service: Arc<str>,
    /// Its canonical revision: `latest`.
    pub(crate) destination_canonical_revision: Arc<str>,
    /// Its namespace.
    pub(crate) destination_workload_namespace: Arc<str>,
    /// The SPIFFE ID its end of the tunnel proved.
    pub(crate) destination_principal: Arc<str>,
    /// The backend service's host name, `NAME.NAMESPACE.svc.cluster.local`.
    pub(crate) destination_service: Arc<str>,
    /// The backend service's name, as the Ingress names it.
    pub(crate) destination_service_name: Arc<str>,
    /// The backend service's namespace (the Ingress's).
    pub(crate) destination_service_namespace: Arc<str>,
    /// The Ingress rule that matched: `NAMESPACE/NAME:PATH` (`NAMESPACE/NAME:defaultBackend`
    /// for a default backend, `*` for a rule without a path).
    pub(crate) route: Arc<str>,
    /// `grpc` for a `content-type: application/grpc*` request, else `http`.
    pub(crate) request_protocol: &'static str,
    /// The status sent to the client; `0` when none was (the client left first).
    pub(crate) response_code: u16,
    /// Envoy's response flag for what went wrong, `-` for nothing (see docs/gateway.md).
    pub(crate) response_flags: &'static str,
    /// `mutual_tls` once a backend was reached over HBONE, else `unknown`.
    pub(crate) connection_security_policy: &'static str,
}

/// A duration histogram whose observation is two atomic additions (the bucket and the sum),
/// encoded through prometheus-client as an OpenMetrics histogram.
#[derive(Debug, Clone, Default)]
pub(crate) struct DurationHistogram {
    inner: Arc<HistogramInner>,
}

#[derive(Debug, Default)]
struct HistogramInner {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; 20],
    /// The sum of the observations, in microseconds.
    sum_us: AtomicU64,
}

/// The gateway's metric handles; every count goes through them, registered or not.
#[derive(Debug, Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) duration: Family<RequestLabels, DurationHistogram>,
    pub(crate) tunnels: Gauge,
    pub(crate) tunnels_opened: Counter,
}

/// The handles of one label set, and the labels (the access log names the destination from
/// them).
#[derive(Debug)]
pub(crate) struct Handles {
    pub(crate) requests: Counter,
    pub(crate) duration: DurationHistogram,
    pub(crate) labels: RequestLabels,
}

/// What a request's label set is cached by, within one configuration: the route (the address
/// of its entry in the configuration's route table, 0 for none) and the endpoint determine
/// every other label there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct StatsKey {
    pub(crate) route: usize,
    pub(crate) endpoint: Option<SocketAddr>,
    pub(crate) code: u16,
    pub(crate) flag: Flag,
    pub(crate) grpc: bool,
}

/// The label cache of one configuration.
#[derive(Debug, Default)]
pub(crate) struct StatsCache {
    map: RwLock<HashMap<StatsKey, Arc<Handles>, foldhash::fast::RandomState>>,
}

/// The metrics read at scrape time from the running gateway.
#[derive(Debug)]
struct GatewayCollector {
    shared: Weak<Shared>,
}

// === impl DurationHistogram ===

impl DurationHistogram {
    /// Counts one observation of `elapsed`.
    pub(crate) fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_US.partition_point(|&bound| bound < us);
        self.inner.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.inner.sum_us.fetch_add(us, Ordering::Relaxed);
    }
}

impl TypedMetric for DurationHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DurationHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let mut count = 0;
        let buckets: Vec<(f64, u64)> = self
            .inner
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let n = n.load(Ordering::Relaxed);
                count += n;
                // prometheus-client writes `f64::MAX` as `+Inf`.
                (DURATION_BUCKETS_MS.get(i).copied().unwrap_or(f64::MAX), n)
            })
            .collect();
        let sum = self.inner.sum_us.load(Ordering::Relaxed) as f64 / 1000.0;
        encoder
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

// === impl Metrics ===

impl Metrics {
    /// The handles of `labels`, from the families (creating them the first time).
    pub(crate) fn handles(&self, labels: RequestLabels) -> Handles {
        Handles {
            requests: self.requests.get_or_create_owned(&labels),
            duration: self.duration.get_or_create_owned(&labels),
            labels,
        }
    }
}

/// Registers the gateway's metrics (see the module's table) in `registry`.
pub(crate) fn register(shared: &Arc<Shared>, registry: &mut Registry) {
    let metrics = &shared.metrics;
    registry.register(
        "istio_requests",
        "Requests the gateway served, by response code, route and destination",
        metrics.requests.clone(),
    );
    registry.register(
        "istio_request_duration_milliseconds",
        "Duration of requests, from the request head to the end of the answer, in milliseconds",
        metrics.duration.clone(),
    );
    registry.register(
        "meshkit_gateway_upstream_tunnels",
        "HBONE tunnels open, each carrying one HTTP/1.1 backend connection (busy or pooled)",
        metrics.tunnels.clone(),
    );
    registry.register(
        "meshkit_gateway_upstream_tunnels_opened",
        "HBONE tunnels opened for a new backend connection",
        metrics.tunnels_opened.clone(),
    );
    registry.register_collector(Box::new(GatewayCollector {
        shared: Arc::downgrade(shared),
    }));
}

// === impl StatsCache ===

impl StatsCache {
    /// The handles cached for `key`, or those `make` returns (cached unless the cache is
    /// full).
    pub(crate) fn get_or_insert(
        &self,
        key: &StatsKey,
        make: impl FnOnce() -> Handles,
    ) -> Arc<Handles> {
        if let Some(found) = self.map.read().unwrap_or_else(|e| e.into_inner()).get(key) {
            return found.clone();
        }
        let handles = Arc::new(make());
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if map.len() < MAX_CACHED {
            map.entry(*key).or_insert_with(|| handles.clone());
        }
        handles
    }
}

// === impl GatewayCollector ===

impl Collector for GatewayCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(shared) = self.shared.upgrade() else {
            return Ok(());
        };
        gauge(
            &mut encoder,
            "meshkit_gateway_downstream_connections",
            "Client connections open",
            shared.connections.held() as u64,
        )?;
        let (conns, handshakes) = (shared.connections.stats(), shared.handshakes.stats());
        let mut family = encoder.encode_descriptor(
            "meshkit_gateway_downstream_connections_refused",
            "Client connections closed for the fair share of places among sources: at accept (source_share: the source holds its share; full: every place is held fairly), or open ones closed to give their place to a source holding fewer (evicted); tls_* for the places of TLS handshakes",
            None,
            MetricType::Counter,
        )?;
        for (reason, count) in [
            ("source_share", conns.refused_share()),
            ("full", conns.refused_full()),
            ("evicted", conns.evicted()),
            ("tls_source_share", handshakes.refused_share()),
            ("tls_full", handshakes.refused_full()),
            ("tls_evicted", handshakes.evicted()),
        ] {
            let labels = [("reason", reason)];
            let metric = family.encode_family(&labels)?;
            ConstCounter::new(count).encode(metric)?;
        }
        gauge(
            &mut encoder,
            "meshkit_gateway_upstream_connections",
            "HBONE connections (mutual TLS, HTTP/2) open to node proxies",
            shared.client.pooled_connections() as u64,
        )?;
        let opened = ConstCounter::new(shared.client.connections_opened());
        let metric = encoder.encode_descriptor(
            "meshkit_gateway_upstream_connections_opened",
            "HBONE connections established",
            None,
            opened.metric_type(),
        )?;
        opened.encode(metric)?;
        gauge(
            &mut encoder,
            "meshkit_gateway_upstream_tunnels_idle",
            "Pooled backend connections (each in its HBONE tunnel) waiting for a request",
            shared.pool.idle_count() as u64,
        )?;
        let current = shared.current.borrow().clone();
        gauge(
            &mut encoder,
            "meshkit_gateway_routes",
            "Routes (Ingress rule paths and default backends) of the current configuration",
            current.table.route_count() as u64,
        )?;
        let expiring: Vec<_> = current
            .certs_info
            .iter()
            .filter_map(|c| Some((c, c.not_after?)))
            .collect();
        if !expiring.is_empty() {
            let mut family = encoder.encode_descriptor(
                "meshkit_gateway_tls_certificate_expiry_timestamp_seconds",
                "When the leaf certificate of each TLS Secret expires, in seconds since the Unix epoch",
                None,
                MetricType::Gauge,
            )?;
            for (cert, not_after) in expiring {
                let labels = [
                    ("namespace", cert.namespace.as_str()),
                    ("name", cert.name.as_str()),
                ];
                let metric = family.encode_family(&labels)?;
                ConstGauge::new(not_after).encode(metric)?;
            }
        }
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
    let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
    gauge.encode(metric)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_envoys_buckets() {
        let h = DurationHistogram::default();
        h.observe(Duration::from_micros(500)); // le 0.5
        h.observe(Duration::from_micros(501)); // le 1
        h.observe(Duration::from_millis(7)); // le 10
        h.observe(Duration::from_secs(7200)); // +Inf
        let counts: Vec<u64> = h
            .inner
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        assert_eq!(counts[0], 1);
        assert_eq!(counts[1], 1);
        assert_eq!(counts[3], 1);
        assert_eq!(counts[19], 1);
        assert_eq!(counts.iter().sum::<u64>(), 4);
        assert_eq!(BOUNDS_US[18], 3_600_000_000);
    }
}
