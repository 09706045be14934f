//! A hook that sees every request the server receives and every response it sends.

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};

/// Sees every request received on every stream, before the server handles it (including
/// requests that end their stream, such as one over
/// [`ServerConfig::max_types_per_stream`](crate::ServerConfig::max_types_per_stream)), and
/// every response a stream sends: what a control plane counts its pushes and NACKs by.
///
/// Every method does nothing by default. They run on the stream's task, between reading a
/// request and answering it, or as a response is handed to the transport: keep them quick
/// and never block. Install one with
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

    /// A State-of-the-World response, as the stream hands it to the transport: one per push
    /// of a type, and each injected one
    /// ([`AdsServer::inject_sotw`](crate::AdsServer::inject_sotw)).
    fn on_sotw_response(&self, response: &DiscoveryResponse) {
        let _ = response;
    }

    /// A Delta response, as [`on_sotw_response`](Self::on_sotw_response) is for State of
    /// the World.
    fn on_delta_response(&self, response: &DeltaDiscoveryResponse) {
        let _ = response;
    }
}

impl<T: RequestObserver + ?Sized> RequestObserver for Arc<T> {
    fn on_sotw_request(&self, request: &DiscoveryRequest) {
        (**self).on_sotw_request(request);
    }

    fn on_delta_request(&self, request: &DeltaDiscoveryRequest) {
        (**self).on_delta_request(request);
    }

    fn on_sotw_response(&self, response: &DiscoveryResponse) {
        (**self).on_sotw_response(response);
    }

    fn on_delta_response(&self, response: &DeltaDiscoveryResponse) {
        (**self).on_delta_response(response);
    }
}
