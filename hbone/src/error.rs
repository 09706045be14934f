//! The one error type of the crate: opaque, with accessors for what callers branch on.

use std::fmt;
use std::io;

use http::StatusCode;
use meshkit_identity::VerifyError;

/// An HBONE error. Ask it what happened with the `is_*` accessors; `Display` says what failed
/// at this level and [`source`](std::error::Error::source) holds the cause (the I/O, TLS,
/// identity or HTTP/2 error), so print the chain to see both.
pub struct Error {
    kind: Kind,
}

#[derive(Debug)]
pub(crate) enum Kind {
    /// Connecting the transport (TCP, or an outer tunnel) failed.
    Connect(io::Error),
    /// Timed out: TLS handshake, connect, or waiting for the CONNECT response.
    Timeout(&'static str),
    /// TLS failed for a reason other than the peer's identity.
    Tls(io::Error),
    /// The peer's certificate was refused (wrong identity, untrusted, invalid SVID).
    PeerIdentity(VerifyError),
    /// The local identity's certificate could not be obtained.
    LocalIdentity(crate::client::LocalIdentityError),
    /// HTTP/2 failed (protocol error, GOAWAY, reset).
    H2(h2::Error),
    /// The server answered the CONNECT with a status other than 200.
    Status(StatusCode),
    /// The target is not valid (for example, headers that cannot be sent).
    InvalidTarget(String),
    /// The client or server is shutting down.
    Closed,
}

impl Error {
    pub(crate) fn new(kind: Kind) -> Self {
        Self { kind }
    }

    pub(crate) fn from_tls(e: io::Error) -> Self {
        let refused = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .and_then(meshkit_identity::verify_error)
            .cloned();
        match refused {
            Some(reason) => Self::new(Kind::PeerIdentity(reason)),
            None => Self::new(Kind::Tls(e)),
        }
    }

    /// Connecting the transport to the peer failed.
    pub fn is_connect(&self) -> bool {
        matches!(self.kind, Kind::Connect(_))
    }

    /// A deadline passed (connect, TLS handshake, CONNECT response).
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, Kind::Timeout(_))
    }

    /// The TLS handshake failed for a reason other than the peer's identity.
    pub fn is_tls(&self) -> bool {
        matches!(self.kind, Kind::Tls(_))
    }

    /// The peer's certificate was refused; [`Error::peer_identity_error`] says why.
    pub fn is_peer_identity(&self) -> bool {
        matches!(self.kind, Kind::PeerIdentity(_))
    }

    /// Why the peer's certificate was refused, if that is what happened.
    pub fn peer_identity_error(&self) -> Option<&VerifyError> {
        match &self.kind {
            Kind::PeerIdentity(e) => Some(e),
            _ => None,
        }
    }

    /// The local identity's certificate could not be obtained.
    pub fn is_local_identity(&self) -> bool {
        matches!(self.kind, Kind::LocalIdentity(_))
    }

    /// An HTTP/2 error (protocol error, GOAWAY, stream reset).
    pub fn is_h2(&self) -> bool {
        matches!(self.kind, Kind::H2(_))
    }

    /// The server refused the CONNECT; [`Error::status`] has its status.
    pub fn is_status(&self) -> bool {
        matches!(self.kind, Kind::Status(_))
    }

    /// The status the server answered instead of 200, if that is what happened.
    pub fn status(&self) -> Option<StatusCode> {
        match self.kind {
            Kind::Status(s) => Some(s),
            _ => None,
        }
    }

    /// The target could not be turned into a request.
    pub fn is_invalid_target(&self) -> bool {
        matches!(self.kind, Kind::InvalidTarget(_))
    }

    /// The client or server is shut down.
    pub fn is_closed(&self) -> bool {
        matches!(self.kind, Kind::Closed)
    }

    /// Whether the peer said it did not process the request, which may then be sent again
    /// (RFC 9113 section 8.7): it refused the stream (REFUSED_STREAM), or a graceful GOAWAY
    /// (NO_ERROR) left the stream out. A GOAWAY with an error code ends every stream, also
    /// ones the peer may already have acted on, so it does not count.
    pub(crate) fn is_unprocessed(&self) -> bool {
        match &self.kind {
            Kind::H2(e) => {
                e.is_remote()
                    && (e.reason() == Some(h2::Reason::REFUSED_STREAM)
                        || (e.is_go_away() && e.reason() == Some(h2::Reason::NO_ERROR)))
            }
            _ => false,
        }
    }

    /// Whether a pooled connection that produced this error should be dropped and the request
    /// tried once on a new connection (the connection went away under us).
    pub(crate) fn is_connection_gone(&self) -> bool {
        match &self.kind {
            Kind::H2(e) => {
                e.is_go_away() || e.is_io() || e.reason() == Some(h2::Reason::REFUSED_STREAM)
            }
            _ => false,
        }
    }
}

impl From<h2::Error> for Error {
    fn from(e: h2::Error) -> Self {
        Self::new(Kind::H2(e))
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            // The cause of these is in `source()`, not repeated here.
            Kind::Connect(_) => f.write_str("connecting to the HBONE peer failed"),
            Kind::Timeout(what) => write!(f, "timed out: {what}"),
            Kind::Tls(_) => f.write_str("TLS with the HBONE peer failed"),
            Kind::PeerIdentity(_) => f.write_str("HBONE peer identity refused"),
            Kind::LocalIdentity(_) => f.write_str("local identity unavailable"),
            Kind::H2(_) => f.write_str("HTTP/2 connection or stream failed"),
            Kind::Status(s) => write!(f, "HBONE peer answered CONNECT with {s}"),
            Kind::InvalidTarget(e) => write!(f, "invalid HBONE target: {e}"),
            Kind::Closed => f.write_str("HBONE endpoint is shut down"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Connect(e) | Kind::Tls(e) => Some(e),
            Kind::PeerIdentity(e) => Some(e),
            Kind::H2(e) => Some(e),
            Kind::LocalIdentity(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_this_level_only_and_the_cause_is_the_source() {
        let err = Error::new(Kind::Connect(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "connection refused",
        )));
        assert_eq!(err.to_string(), "connecting to the HBONE peer failed");
        let cause = std::error::Error::source(&err).expect("the I/O error");
        assert_eq!(cause.to_string(), "connection refused");
        assert_eq!(
            meshkit_identity::ErrorChain(&err).to_string(),
            "connecting to the HBONE peer failed: connection refused"
        );
    }

    #[test]
    fn chain_leaves_out_a_cause_its_parent_already_printed() {
        #[derive(Debug)]
        struct Loud(io::Error);
        impl fmt::Display for Loud {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "loud: {}", self.0)
            }
        }
        impl std::error::Error for Loud {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let err = Error::new(Kind::Tls(io::Error::other(Loud(io::Error::other("eof")))));
        assert_eq!(
            meshkit_identity::ErrorChain(&err).to_string(),
            "TLS with the HBONE peer failed: loud: eof"
        );
    }
}
