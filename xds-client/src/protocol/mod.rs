//! The protocol core: ADS without I/O and without a clock of its own.
//!
//! A [`Session`] holds the subscriptions, versions, nonces, the resource cache and the timers of
//! one ADS client, for State-of-the-World or Delta. Inputs are method calls: responses
//! ([`Session::handle_response`]), subscription changes ([`Session::subscribe`] and friends),
//! stream state ([`Session::on_connected`], [`Session::on_disconnected`]) and the current time
//! ([`Session::handle_timeout`]). Outputs are pulled: requests to send
//! ([`Session::poll_request`]), events for watchers ([`Session::poll_event`]) and the next
//! deadline ([`Session::poll_timeout`]). The caller owns the socket and the clock, so every rule
//! of the protocol is tested with a scripted server and a simulated clock.
//!
//! [`Failover`] is the same for the choice of server when several are configured (gRFC A71):
//! which to dial, when, and when a higher-priority one that answers again takes over.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use envoy_types::pb::envoy::config::cluster::v3::Cluster;
//! use meshkit_xds_client::protocol::{Mode, Request, Session, SessionConfig};
//! use meshkit_xds_client::ResourceType;
//!
//! let mut session = Session::new(SessionConfig::new(Mode::Delta));
//! session.subscribe(ResourceType::of::<Cluster>(), "backend");
//! let now = Instant::now();
//! session.on_connected(now);
//! let Some(Request::Delta(req)) = session.poll_request(now) else { panic!() };
//! assert_eq!(req.resource_names_subscribe, ["backend"]);
//! // Nothing arrives: the resource is declared non-existent 15 s after the request.
//! assert_eq!(session.poll_timeout(), Some(now + Duration::from_secs(15)));
//! ```

mod decode;
mod failover;
mod session;

pub use failover::Failover;
pub use session::{Event, Mode, RemovalReason, Request, Response, Session, SessionConfig};

/// For fuzzing: decodes `bytes` as a response of `mode`, feeds it to a connected session
/// watching every cluster and one by name, then fires every timer. Returns whether the response
/// got the answers it must: exactly one for a cluster response, none for a type nobody watches
/// (true as well when the bytes are not a response at all). Must never panic, whatever the
/// bytes.
#[doc(hidden)]
pub fn fuzz_response(mode: Mode, bytes: &[u8]) -> bool {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    use prost::Message;

    use crate::Resource;

    let response = match mode {
        Mode::StateOfTheWorld => DiscoveryResponse::decode(bytes).map(Response::Sotw),
        Mode::Delta => DeltaDiscoveryResponse::decode(bytes).map(Response::Delta),
    };
    let Ok(response) = response else {
        return true;
    };
    let watched = match &response {
        Response::Sotw(r) => r.type_url == Cluster::TYPE_URL,
        Response::Delta(r) => r.type_url == Cluster::TYPE_URL,
    };
    let kind = crate::ResourceType::of::<Cluster>();
    let mut session = Session::new(SessionConfig::new(mode));
    session.subscribe_wildcard(kind);
    session.subscribe(kind, "a");
    let now = std::time::Instant::now();
    session.on_connected(now);
    while session.poll_request(now).is_some() {}
    session.handle_response(now, response);
    let answers = std::iter::from_fn(|| session.poll_request(now)).count();
    while session.poll_event().is_some() {}
    while let Some(t) = session.poll_timeout() {
        session.handle_timeout(t);
    }
    answers == usize::from(watched)
}
