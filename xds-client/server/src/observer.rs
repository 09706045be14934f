//! A hook that sees every request the server receives.

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};

/// Sees every request received on every stream, before the server handles it (including
/// requests that end their stream, such as one over
/// [`ServerConfig::max_types_per_stream`](crate::ServerConfig::max_types_per_stream)).
///
/// Both methods do nothing by default. They run on the stream's task, between reading a
/// request and answering it: keep them quick and never block. Install one with
/// [`AdsServer::with_observer`](crate::AdsServer::with_observer).
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use meshkit_xds_server::RequestObserver;
/// use meshkit_xds_server::envoy::DeltaDiscoveryRequest;
///
/// #[derive(Default)]
/// struct CountNacks(AtomicUsize);
///
/// impl RequestObserver for CountNacks {
///     fn on_delta_request(&self, request: &DeltaDiscoveryRequest) {
///         if request.error_detail.is_some() {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait RequestObserver: Send + Sync + 'static {
    /// A State-of-the-World request (`StreamAggregatedResources`).
    fn on_sotw_request(&self, request: &DiscoveryRequest) {
        let _ = request;
    }

    /// A Delta request (`DeltaAggregatedResources`).
    fn on_delta_request(&self, request: &DeltaDiscoveryRequest) {
        let _ = request;
    }
}

impl<T: RequestObserver + ?Sized> RequestObserver for Arc<T> {
    fn on_sotw_request(&self, request: &DiscoveryRequest) {
        (**self).on_sotw_request(request);
    }

    fn on_delta_request(&self, request: &DeltaDiscoveryRequest) {
        (**self).on_delta_request(request);
    }
}
